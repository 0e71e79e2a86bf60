//! Exact decimals for FIX prices and quantities, and their conversion to
//! the engine's integer ticks and lots. Nothing is rounded: a price that is
//! not a whole number of ticks is an error the caller rejects with a
//! reason.

/// `mantissa * 10^-scale`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Decimal {
    pub mantissa: i128,
    pub scale: u32,
}

/// At most this many digits in a FIX decimal (enough for any price or
/// quantity; more is refused rather than rounded). A text with more whose
/// leading zeros and zeros after the point past its last other digit
/// leave few enough is read without them (its value, with fewer
/// decimals): `0.1000000000000000000000000000000000` is `0.1`.
pub const MAX_DIGITS: usize = 30;

impl Decimal {
    /// Parses `[-]digits[.digits]` (the FIX float format; at least one
    /// digit, no exponent, no sign other than a leading minus).
    pub fn parse(text: &[u8]) -> Option<Decimal> {
        let (negative, mut digits) = match text.first() {
            Some(b'-') => (true, &text[1..]),
            _ => (false, text),
        };
        if digits.len() > MAX_DIGITS + 1 {
            // Zeros that do not change the value (but leave one digit).
            while digits.len() > 1 && digits[0] == b'0' && digits[1].is_ascii_digit() {
                digits = &digits[1..];
            }
            if digits.contains(&b'.') {
                while digits.len() > 1 && digits[digits.len() - 1] == b'0' && digits[digits.len() - 2] != b'.' {
                    digits = &digits[..digits.len() - 1];
                }
            }
        }
        let mut mantissa: i128 = 0;
        let mut scale = 0u32;
        let mut seen_point = false;
        let mut count = 0usize;
        for &byte in digits {
            match byte {
                b'0'..=b'9' => {
                    count += 1;
                    if count > MAX_DIGITS {
                        return None;
                    }
                    mantissa = mantissa * 10 + i128::from(byte - b'0');
                    if seen_point {
                        scale += 1;
                    }
                }
                b'.' if !seen_point => seen_point = true,
                _ => return None,
            }
        }
        if count == 0 {
            return None;
        }
        Some(Decimal { mantissa: if negative { -mantissa } else { mantissa }, scale })
    }

    /// An integer as a decimal.
    pub fn from_int(value: i128) -> Decimal {
        Decimal { mantissa: value, scale: 0 }
    }

    /// `self / unit` if that is a whole number (and fits an i128); `None`
    /// if it is not, or `unit` is not positive.
    pub fn whole_units(self, unit: Decimal) -> Option<i128> {
        if unit.mantissa <= 0 {
            return None;
        }
        // self / unit = (m_s * 10^s_u) / (m_u * 10^s_s)
        let numerator = self.mantissa.checked_mul(10i128.checked_pow(unit.scale)?)?;
        let denominator = unit.mantissa.checked_mul(10i128.checked_pow(self.scale)?)?;
        if numerator % denominator != 0 {
            return None;
        }
        Some(numerator / denominator)
    }

    /// `count * self`.
    pub fn times(self, count: i128) -> Option<Decimal> {
        Some(Decimal { mantissa: self.mantissa.checked_mul(count)?, scale: self.scale })
    }

    /// The shortest decimal text of this value (`1.5`, `100`, `-0.25`).
    pub fn to_text(self) -> String {
        let mut mantissa = self.mantissa;
        let mut scale = self.scale;
        while scale > 0 && mantissa % 10 == 0 {
            mantissa /= 10;
            scale -= 1;
        }
        let negative = mantissa < 0;
        let digits = mantissa.unsigned_abs().to_string();
        let text = if scale == 0 {
            digits
        } else if digits.len() as u32 > scale {
            let split = digits.len() - scale as usize;
            format!("{}.{}", &digits[..split], &digits[split..])
        } else {
            format!("0.{}{}", "0".repeat((scale as usize) - digits.len()), digits)
        };
        if negative { format!("-{text}") } else { text }
    }
}

/// `numerator / denominator * unit` written with `extra` more decimals than
/// `unit` has, rounded half away from zero: an average price, which is
/// not exact in general (FIX's AvgPx is a float).
pub fn average_text(numerator: i128, denominator: i128, unit: Decimal, extra: u32) -> String {
    if denominator == 0 {
        return "0".into();
    }
    let Some(scaled) = numerator.checked_mul(unit.mantissa).and_then(|n| n.checked_mul(10i128.pow(extra))) else {
        return "0".into();
    };
    let quotient = scaled / denominator;
    let remainder = scaled % denominator;
    let rounded = if remainder.abs() * 2 >= denominator.abs() { quotient + scaled.signum() * denominator.signum() } else { quotient };
    Decimal { mantissa: rounded, scale: unit.scale + extra }.to_text()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(text: &str) -> Decimal {
        Decimal::parse(text.as_bytes()).expect(text)
    }

    #[test]
    fn parses_the_fix_float_format_only() {
        assert_eq!(d("002000.00"), Decimal { mantissa: 200000, scale: 2 });
        assert_eq!(d("-0.5"), Decimal { mantissa: -5, scale: 1 });
        assert_eq!(d("7."), Decimal { mantissa: 7, scale: 0 });
        assert_eq!(d(".25"), Decimal { mantissa: 25, scale: 2 });
        // Past 30 digits, only zeros that do not change the value are left out.
        assert_eq!(d("0.1000000000000000000000000000000000"), Decimal { mantissa: 1, scale: 1 });
        assert_eq!(d("-00000000000000000000000000000002.50000000000"), Decimal { mantissa: -25, scale: 1 });
        for bad in ["", "-", ".", "1e5", "1.2.3", "+1", "12a", " 1", "1234567890123456789012345678901", "1.00000000000000000000000000000000001", "1000000000000000000000000000000000.0"] {
            assert_eq!(Decimal::parse(bad.as_bytes()), None, "{bad}");
        }
    }

    #[test]
    fn converts_to_whole_ticks_exactly_or_not_at_all() {
        assert_eq!(d("100.25").whole_units(d("0.05")), Some(2005));
        assert_eq!(d("100.26").whole_units(d("0.05")), None);
        assert_eq!(d("100").whole_units(d("0.01")), Some(10000));
        assert_eq!(d("1.5").whole_units(d("1")), None);
        assert_eq!(d("3").whole_units(d("0")), None);
        assert_eq!(d("2000.000").whole_units(d("1")), Some(2000));
    }

    #[test]
    fn writes_the_shortest_text() {
        assert_eq!(d("0.05").times(2005).map(Decimal::to_text), Some("100.25".into()));
        assert_eq!(d("1").times(7).map(Decimal::to_text), Some("7".into()));
        assert_eq!(d("0.001").times(5).map(Decimal::to_text), Some("0.005".into()));
        assert_eq!(d("-0.5").to_text(), "-0.5");
        assert_eq!(average_text(301, 3, d("0.01"), 4), "1.003333");
        assert_eq!(average_text(2, 3, d("1"), 2), "0.67");
        assert_eq!(average_text(0, 0, d("1"), 4), "0");
    }
}
