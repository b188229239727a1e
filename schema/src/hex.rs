//! Upper-case hex text of message ids (RocketMQ writes unique ids and offset ids this way).
//! One table lookup per nibble: ids are made for every message, so no `format!` per byte.

const DIGITS: &[u8; 16] = b"0123456789ABCDEF";

/// `bytes` as upper-case hex, two characters per byte.
#[must_use]
pub fn upper_hex(bytes: &[u8]) -> String {
    let mut text = String::with_capacity(bytes.len() * 2);
    push_upper_hex(bytes, &mut text);
    text
}

/// Appends `bytes` to `text` as upper-case hex, two characters a byte.
pub fn push_upper_hex(bytes: &[u8], text: &mut String) {
    for &byte in bytes {
        text.push(char::from(DIGITS[usize::from(byte >> 4)]));
        text.push(char::from(DIGITS[usize::from(byte & 0x0F)]));
    }
}

#[cfg(test)]
mod tests {
    use super::upper_hex;

    #[test]
    fn matches_the_formatter() {
        let bytes: Vec<u8> = (0..=255).collect();
        let expected: String = bytes.iter().map(|b| format!("{b:02X}")).collect();
        assert_eq!(upper_hex(&bytes), expected);
        assert_eq!(upper_hex(&[]), "");
    }
}
