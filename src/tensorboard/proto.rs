//! The few pieces of the protobuf wire format that TensorBoard's messages need: varints,
//! fixed 32/64-bit numbers and length-delimited fields (strings, bytes, nested messages).
//! Encoding them by hand keeps protobuf's generated code and its build out of the tree.

/// Wire types ("Encoding", protobuf.dev/programming-guides/encoding).
const VARINT: u64 = 0;
const FIXED64: u64 = 1;
const LENGTH_DELIMITED: u64 = 2;
const FIXED32: u64 = 5;

/// A message being encoded: its fields in the order they are added.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Message(Vec<u8>);

impl Message {
    pub fn new() -> Self {
        Self::default()
    }

    /// An unsigned integer field (int32, int64 of a non-negative value, enum, bool).
    pub fn uint(mut self, field: u32, value: u64) -> Self {
        self.key(field, VARINT);
        varint(&mut self.0, value);
        self
    }

    pub fn double(mut self, field: u32, value: f64) -> Self {
        self.key(field, FIXED64);
        self.0.extend_from_slice(&value.to_le_bytes());
        self
    }

    pub fn float(mut self, field: u32, value: f32) -> Self {
        self.key(field, FIXED32);
        self.0.extend_from_slice(&value.to_le_bytes());
        self
    }

    pub fn bytes(mut self, field: u32, value: &[u8]) -> Self {
        self.key(field, LENGTH_DELIMITED);
        varint(&mut self.0, value.len() as u64);
        self.0.extend_from_slice(value);
        self
    }

    pub fn string(self, field: u32, value: &str) -> Self {
        self.bytes(field, value.as_bytes())
    }

    pub fn message(self, field: u32, value: &Message) -> Self {
        self.bytes(field, &value.0)
    }

    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }

    fn key(&mut self, field: u32, wire_type: u64) {
        varint(&mut self.0, (u64::from(field) << 3) | wire_type);
    }
}

/// `value` as a base-128 varint, low groups first.
fn varint(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        out.push((value as u8 & 0x7f) | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The examples of protobuf's encoding guide: 150 in field 1 is `08 96 01`; "testing" in
    /// field 2 is `12 07 74 65 73 74 69 6e 67`; a message {a = 150} in field 3 is
    /// `1a 03 08 96 01`.
    #[test]
    fn fields_encode_as_the_protobuf_guide_shows() {
        assert_eq!(Message::new().uint(1, 150).as_bytes(), [0x08, 0x96, 0x01]);
        assert_eq!(
            Message::new().string(2, "testing").as_bytes(),
            [0x12, 0x07, b't', b'e', b's', b't', b'i', b'n', b'g']
        );
        let inner = Message::new().uint(1, 150);
        assert_eq!(
            Message::new().message(3, &inner).as_bytes(),
            [0x1a, 0x03, 0x08, 0x96, 0x01]
        );
    }

    #[test]
    fn fixed_width_numbers_are_little_endian_after_their_key() {
        assert_eq!(
            Message::new().double(1, 1.0).as_bytes(),
            [0x09, 0, 0, 0, 0, 0, 0, 0xf0, 0x3f]
        );
        assert_eq!(
            Message::new().float(2, 1.0).as_bytes(),
            [0x15, 0, 0, 0x80, 0x3f]
        );
        assert_eq!(
            Message::new().uint(1, u64::MAX).as_bytes().len(),
            1 + 10,
            "a 64-bit varint takes ten bytes"
        );
    }
}
