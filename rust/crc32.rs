//! CRC-32 (IEEE 802.3, the reflected polynomial `0xEDB88320` of zlib, gzip and PNG), computed
//! by slicing 8 bytes at a time. It detects every error burst of up to 32 bits, so any single
//! changed byte; `zlib.crc32` computes the same value.
#![forbid(unsafe_code)]

const POLY: u32 = 0xEDB8_8320;

#[allow(clippy::cast_possible_truncation)]
const fn tables() -> [[u32; 256]; 8] {
    let mut t = [[0u32; 256]; 8];
    let mut i = 0;
    while i < 256 {
        let mut c = i as u32;
        let mut k = 0;
        while k < 8 {
            c = if c & 1 == 0 { c >> 1 } else { POLY ^ (c >> 1) };
            k += 1;
        }
        t[0][i] = c;
        i += 1;
    }
    let mut i = 0;
    while i < 256 {
        let mut s = 1;
        while s < 8 {
            let prev = t[s - 1][i];
            t[s][i] = (prev >> 8) ^ t[0][(prev & 0xFF) as usize];
            s += 1;
        }
        i += 1;
    }
    t
}

static TABLES: [[u32; 256]; 8] = tables();

/// CRC-32 of `data`.
#[must_use]
pub(crate) fn crc32(data: &[u8]) -> u32 {
    let t = &TABLES;
    let mut crc = !0u32;
    let mut chunks = data.chunks_exact(8);
    for c in &mut chunks {
        let lo = u32::from_le_bytes([c[0], c[1], c[2], c[3]]) ^ crc;
        let hi = u32::from_le_bytes([c[4], c[5], c[6], c[7]]);
        crc = t[7][(lo & 0xFF) as usize]
            ^ t[6][((lo >> 8) & 0xFF) as usize]
            ^ t[5][((lo >> 16) & 0xFF) as usize]
            ^ t[4][(lo >> 24) as usize]
            ^ t[3][(hi & 0xFF) as usize]
            ^ t[2][((hi >> 8) & 0xFF) as usize]
            ^ t[1][((hi >> 16) & 0xFF) as usize]
            ^ t[0][(hi >> 24) as usize];
    }
    for &b in chunks.remainder() {
        crc = t[0][((crc ^ u32::from(b)) & 0xFF) as usize] ^ (crc >> 8);
    }
    !crc
}

#[cfg(test)]
mod tests {
    use super::crc32;

    /// Bit by bit, straight from the definition.
    fn slow(data: &[u8]) -> u32 {
        let mut crc = !0u32;
        for &b in data {
            crc ^= u32::from(b);
            for _ in 0..8 {
                crc = if crc & 1 == 0 {
                    crc >> 1
                } else {
                    super::POLY ^ (crc >> 1)
                };
            }
        }
        !crc
    }

    #[test]
    fn matches_the_standard_check_value_and_the_bitwise_definition() {
        assert_eq!(crc32(b"123456789"), 0xCBF4_3926);
        assert_eq!(crc32(b""), 0);
        let data: Vec<u8> = (0..1000u32).map(|i| (i * 7919 % 251) as u8).collect();
        for len in 0..40 {
            assert_eq!(crc32(&data[..len]), slow(&data[..len]), "len {len}");
        }
        assert_eq!(crc32(&data), slow(&data));
    }

    #[test]
    fn every_single_byte_change_is_detected() {
        let data: Vec<u8> = (0..300u32).map(|i| (i * 31 % 256) as u8).collect();
        let reference = crc32(&data);
        for i in 0..data.len() {
            for flip in [1u8, 0x80, 0xFF] {
                let mut d = data.clone();
                d[i] ^= flip;
                assert_ne!(crc32(&d), reference, "byte {i} ^ {flip:#x}");
            }
        }
    }
}
