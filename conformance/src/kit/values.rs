//! Leader values a store could mangle, for every backend's election tests.

use lockwright_core::MAX_VALUE_LEN;

/// Every byte value, four times over: exactly the largest value allowed.
pub fn every_byte() -> Vec<u8> {
    (0..MAX_VALUE_LEN).map(|i| (i % 256) as u8).collect()
}

/// Values a store could mangle: NUL, newlines (memcached's own item
/// separator), spaces at either end, quotes and backslashes (SQL text),
/// bytes that are not UTF-8, the empty value (not `NULL`), a largest value
/// that starts with a space, and last the largest one, [`every_byte`].
pub fn awkward() -> Vec<Vec<u8>> {
    let mut spaced = every_byte();
    spaced[0] = b' ';
    vec![
        b"a\0b\nc d".to_vec(),
        b" leading and trailing ".to_vec(),
        b"\r\n".to_vec(),
        b"\n\n 7".to_vec(),
        vec![0xff, 0x00, 0xfe, b'\n', b'\r', b'\'', b'\\', b' '],
        Vec::new(),
        spaced,
        every_byte(),
    ]
}
