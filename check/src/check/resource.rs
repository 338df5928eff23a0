//! The resource the fault run's workers protect: a counter that `check`
//! owns, which refuses a read or write carrying a fence lower than the
//! highest it has seen, and which records every section and op for the
//! checker. Workers reach it over a local TCP connection, one JSON line per
//! request; tests call it in-process.

use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};

use super::history::{mono_ns, History, Op, OpKind, Section};

/// A worker's request. Every one carries the worker's current deadline,
/// so a worker that dies mid-section leaves its latest one behind.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub(crate) enum Request {
    /// The worker holds the lock now.
    Begin {
        /// Worker number.
        w: u32,
        /// Section number.
        s: u64,
        /// The grant's fence.
        fence: Option<u64>,
        /// When the grant came back.
        start: u64,
        /// The lease's deadline.
        deadline: u64,
        /// A reader's section, which only reads.
        #[serde(default)]
        shared: bool,
    },
    /// Read the counter.
    Read {
        /// Worker number.
        w: u32,
        /// Section number.
        s: u64,
        /// The grant's fence.
        fence: Option<u64>,
        /// The lease's deadline now.
        deadline: u64,
        /// A reader's read (its section is shared).
        #[serde(default)]
        shared: bool,
    },
    /// Write `read + 1`.
    Write {
        /// Worker number.
        w: u32,
        /// Section number.
        s: u64,
        /// The grant's fence.
        fence: Option<u64>,
        /// The value this section read.
        read: u64,
        /// The lease's deadline now.
        deadline: u64,
    },
    /// The section is over.
    End {
        /// Worker number.
        w: u32,
        /// Section number.
        s: u64,
        /// When.
        end: u64,
        /// The lease's last deadline.
        deadline: u64,
    },
    /// An acquire failed with an error (not contention).
    Error {
        /// Worker number.
        w: u32,
        /// The error's kind and message.
        what: String,
    },
}

/// The resource's answer.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub(crate) struct Reply {
    /// False if refused: by the fence, or (a `Begin`) past the cut-off.
    pub(crate) ok: bool,
    /// The counter, for a read.
    pub(crate) value: u64,
}

#[derive(Debug, Default)]
struct State {
    value: u64,
    /// The highest fence any accepted op carried, a reader's included.
    highest: Option<u64>,
    /// The highest fence an exclusive holder's accepted op carried.
    highest_exclusive: Option<u64>,
    history: History,
    /// Index in `history.sections` of each open section, by worker.
    open: std::collections::HashMap<u32, usize>,
    /// Killed workers, and when.
    dead: std::collections::HashMap<u32, u64>,
    errors: Vec<String>,
    /// No section may begin at or after this (ns): the end of the run, or
    /// the signal that ended it early.
    cutoff: Option<u64>,
}

/// The counter and its records.
#[derive(Debug, Clone, Default)]
pub(crate) struct Resource {
    state: Arc<Mutex<State>>,
}

impl Resource {
    /// A resource whose history admits `permits` exclusive holders at once.
    pub(crate) fn with_permits(permits: u32) -> Self {
        let r = Resource::default();
        r.state
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .history
            .permits = permits;
        r
    }

    /// Applies one request.
    pub(crate) fn apply(&self, req: Request) -> Reply {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let st = &mut *st;
        let ok = Reply { ok: true, value: 0 };
        let extend = |st: &mut State, w: u32, s: u64, deadline: u64| {
            if let Some(&i) = st.open.get(&w) {
                let sec = &mut st.history.sections[i];
                if sec.seq == s {
                    sec.deadline = sec.deadline.max(deadline);
                }
            }
        };
        match req {
            Request::Begin {
                w,
                s,
                fence,
                start,
                deadline,
                shared,
            } => {
                // Past the end of the run: refused and left out of the
                // history, so the verdict judges only the run asked for. The
                // worker releases and stops.
                if st.cutoff.is_some_and(|c| start >= c) {
                    return Reply {
                        ok: false,
                        value: 0,
                    };
                }
                // A Begin sent just before its worker was killed, and read
                // after: the section ended with the worker.
                let died = st.dead.get(&w).copied();
                if died.is_none() {
                    st.open.insert(w, st.history.sections.len());
                }
                st.history.sections.push(Section {
                    worker: w,
                    seq: s,
                    fence,
                    start,
                    end: died.map(|t| t.max(start)),
                    deadline,
                    shared,
                });
                ok
            }
            Request::Read {
                w,
                s,
                fence,
                deadline,
                shared,
            } => {
                extend(st, w, s, deadline);
                let read = st.value;
                access(st, w, s, OpKind::Read, fence, read, read, shared)
            }
            Request::Write {
                w,
                s,
                fence,
                read,
                deadline,
            } => {
                extend(st, w, s, deadline);
                access(st, w, s, OpKind::Write, fence, read, read + 1, false)
            }
            Request::End {
                w,
                s,
                end,
                deadline,
            } => {
                extend(st, w, s, deadline);
                if let Some(i) = st.open.remove(&w) {
                    if st.history.sections[i].seq == s {
                        st.history.sections[i].end = Some(end);
                    }
                }
                ok
            }
            Request::Error { w, what } => {
                // Errors of workers being stopped are not the run's.
                if st.cutoff.is_none_or(|c| mono_ns() < c) {
                    st.errors.push(format!("worker {w}: {what}"));
                }
                ok
            }
        }
    }

    /// Worker `w` was killed at `t`: a section it had open ends there, for
    /// a dead process does nothing more (a session store frees its lock at
    /// once, well before the lease the worker last reported).
    pub(crate) fn died(&self, w: u32, t: u64) {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        st.dead.insert(w, t);
        if let Some(i) = st.open.remove(&w) {
            let sec = &mut st.history.sections[i];
            sec.end = Some(sec.end.unwrap_or(t).min(t));
        }
    }

    /// No section may begin at or after `t`; an earlier cut-off stands.
    /// Sections already begun run to their end and are judged as usual.
    pub(crate) fn cut_off(&self, t: u64) {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        st.cutoff = Some(st.cutoff.map_or(t, |c| c.min(t)));
    }

    /// The workers holding the lock now, by their own account.
    pub(crate) fn holders(&self) -> Vec<u32> {
        let st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        st.open.keys().copied().collect()
    }

    /// Sections begun so far.
    pub(crate) fn acquisitions(&self) -> u64 {
        let st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        st.history.sections.len() as u64
    }

    /// The history so far, and the acquire errors workers reported.
    pub(crate) fn snapshot(&self) -> (History, Vec<String>) {
        let st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        (st.history.clone(), st.errors.clone())
    }

    /// Serves workers on a fresh local port until the runtime ends.
    ///
    /// # Errors
    /// The listener could not be bound.
    pub(crate) async fn serve(&self) -> std::io::Result<u16> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let port = listener.local_addr()?.port();
        let me = self.clone();
        tokio::spawn(async move {
            while let Ok((conn, _)) = listener.accept().await {
                let me = me.clone();
                tokio::spawn(async move {
                    let _ = me.session(conn).await;
                });
            }
        });
        Ok(port)
    }

    async fn session(&self, conn: TcpStream) -> std::io::Result<()> {
        let _ = conn.set_nodelay(true);
        let (r, mut w) = conn.into_split();
        let mut lines = BufReader::new(r).lines();
        while let Some(line) = lines.next_line().await? {
            let Ok(req) = serde_json::from_str::<Request>(&line) else {
                return Ok(());
            };
            let reply = self.apply(req);
            let mut out = serde_json::to_vec(&reply).unwrap_or_default();
            out.push(b'\n');
            w.write_all(&out).await?;
        }
        Ok(())
    }
}

/// A read or write of the counter: judged by its fence, recorded, and for
/// an accepted write applied (`value` is what it writes). A reader's read
/// (`shared`) must carry a fence no lower than any an exclusive holder
/// used (readers hold at once, in any order of fences); an exclusive
/// holder's op, one no lower than any op used, a reader's included (a
/// writer granted before a reader is stale once the reader is in).
#[allow(clippy::too_many_arguments)]
fn access(
    st: &mut State,
    w: u32,
    s: u64,
    kind: OpKind,
    fence: Option<u64>,
    read: u64,
    value: u64,
    shared: bool,
) -> Reply {
    let accepted = if shared {
        let ok = admits(&mut st.highest_exclusive.clone(), fence);
        if ok {
            st.highest = st.highest.max(fence);
        }
        ok
    } else {
        let ok = admits(&mut st.highest, fence);
        if ok {
            st.highest_exclusive = st.highest_exclusive.max(fence);
        }
        ok
    };
    st.history.ops.push(Op {
        t: mono_ns(),
        worker: w,
        seq: s,
        kind,
        fence,
        before: st.value,
        read,
        value,
        accepted,
    });
    if accepted && kind == OpKind::Write {
        st.value = value;
    }
    Reply {
        ok: accepted,
        value: st.value,
    }
}

/// Whether an op with `fence` may pass, raising the highest fence seen.
fn admits(highest: &mut Option<u64>, fence: Option<u64>) -> bool {
    match (fence, *highest) {
        (Some(f), Some(top)) if f < top => false,
        (Some(f), _) => {
            *highest = Some(f);
            true
        }
        (None, _) => true,
    }
}

/// How a worker reaches the resource.
#[async_trait::async_trait]
pub(crate) trait Channel: Send {
    /// Sends one request and waits for the answer.
    async fn call(&mut self, req: Request) -> std::io::Result<Reply>;
}

#[async_trait::async_trait]
impl Channel for Resource {
    async fn call(&mut self, req: Request) -> std::io::Result<Reply> {
        Ok(self.apply(req))
    }
}

/// A worker process's connection to `check`'s resource.
pub(crate) struct Remote {
    lines: tokio::io::Lines<BufReader<tokio::net::tcp::OwnedReadHalf>>,
    w: tokio::net::tcp::OwnedWriteHalf,
}

impl Remote {
    /// Connects to the resource on a local port.
    ///
    /// # Errors
    /// The connection failed.
    pub(crate) async fn connect(port: u16) -> std::io::Result<Remote> {
        let conn = TcpStream::connect(("127.0.0.1", port)).await?;
        let _ = conn.set_nodelay(true);
        let (r, w) = conn.into_split();
        Ok(Remote {
            lines: BufReader::new(r).lines(),
            w,
        })
    }
}

#[async_trait::async_trait]
impl Channel for Remote {
    async fn call(&mut self, req: Request) -> std::io::Result<Reply> {
        let mut out = serde_json::to_vec(&req).map_err(std::io::Error::other)?;
        out.push(b'\n');
        self.w.write_all(&out).await?;
        let line = self
            .lines
            .next_line()
            .await?
            .ok_or_else(|| std::io::Error::other("the resource closed the connection"))?;
        serde_json::from_str(&line).map_err(std::io::Error::other)
    }
}

#[cfg(test)]
mod tests {
    use super::{Request, Resource};

    fn begin(r: &Resource, w: u32, fence: u64, shared: bool) {
        let ok = r.apply(Request::Begin {
            w,
            s: 1,
            fence: Some(fence),
            start: 1,
            deadline: u64::MAX,
            shared,
        });
        assert!(ok.ok);
    }

    fn read(r: &Resource, w: u32, fence: u64, shared: bool) -> bool {
        r.apply(Request::Read {
            w,
            s: 1,
            fence: Some(fence),
            deadline: u64::MAX,
            shared,
        })
        .ok
    }

    fn write(r: &Resource, w: u32, fence: u64) -> bool {
        r.apply(Request::Write {
            w,
            s: 1,
            fence: Some(fence),
            read: 0,
            deadline: u64::MAX,
        })
        .ok
    }

    /// Readers read in any order of their fences, but never below a
    /// writer's; a writer's op below any fence used, a reader's included,
    /// is stale.
    #[test]
    fn readers_fences_are_judged_by_their_claim() {
        let r = Resource::default();
        begin(&r, 1, 5, false);
        assert!(read(&r, 1, 5, false));
        begin(&r, 2, 6, true);
        begin(&r, 3, 7, true);
        assert!(read(&r, 3, 7, true));
        assert!(
            read(&r, 2, 6, true),
            "a reader below another reader's fence"
        );
        assert!(
            !write(&r, 1, 5),
            "a writer granted before the readers wrote after them"
        );
        begin(&r, 4, 8, false);
        assert!(read(&r, 4, 8, false) && write(&r, 4, 8));
        assert!(
            !read(&r, 3, 7, true),
            "a reader below a later writer's fence read"
        );
    }
}
