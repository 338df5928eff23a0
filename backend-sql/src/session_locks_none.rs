//! Session mode needs PostgreSQL or MySQL; in a build with neither, no
//! session backend can exist.

use lockwright_core::backend::{Acquire, HoldId, Release, Renew};
use lockwright_core::{Error, LockKey, LockStatus, OwnerToken, Result};

use crate::config::SqlConfig;

#[derive(Debug)]
pub(crate) enum SessionLocks {}

impl SessionLocks {
    pub(crate) fn new(config: &SqlConfig) -> Result<Self> {
        Err(Error::config(format!(
            "{}: session mode needs the postgres or mysql cargo feature",
            config.url
        )))
    }
    pub(crate) fn session_ids(&self) -> Vec<i64> {
        match *self {}
    }
    pub(crate) fn shared(&self) -> bool {
        match *self {}
    }
    pub(crate) async fn abandon(&self, _: &LockKey, _: &OwnerToken) -> Result<bool> {
        match *self {}
    }
    pub(crate) async fn try_acquire(&self, _: &HoldId) -> Result<Acquire> {
        match *self {}
    }
    pub(crate) async fn release(&self, _: &LockKey, _: &OwnerToken) -> Result<Release> {
        match *self {}
    }
    pub(crate) async fn renew(&self, _: &LockKey, _: &OwnerToken) -> Result<Renew> {
        match *self {}
    }
    pub(crate) async fn inspect(&self, _: &LockKey) -> Result<LockStatus> {
        match *self {}
    }
    pub(crate) async fn verify(&self) -> Result<()> {
        match *self {}
    }
}
