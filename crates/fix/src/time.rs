//! UTC time stamps as FIX writes them (`YYYYMMDD-HH:MM:SS.sss`), from and to
//! milliseconds since the Unix epoch. The session layer is given the time;
//! it never reads a clock itself.

/// Days since 1970-01-01 of a proleptic Gregorian date (the civil-date
/// algorithm that counts 400-year eras of 146,097 days).
fn days_from_civil(year: i64, month: u32, day: u32) -> i64 {
    let year = if month <= 2 { year - 1 } else { year };
    let era = year.div_euclid(400);
    let year_of_era = year - era * 400;
    let month = i64::from(month);
    let day_of_year = (153 * (if month > 2 { month - 3 } else { month + 9 }) + 2) / 5 + i64::from(day) - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    era * 146_097 + day_of_era - 719_468
}

/// The inverse of [`days_from_civil`].
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let day_of_era = z - era * 146_097;
    let year_of_era = (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let mp = (5 * day_of_year + 2) / 153;
    let day = (day_of_year - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

/// `YYYYMMDD-HH:MM:SS.sss` for `millis` since the epoch.
pub fn format_timestamp(millis: i64) -> String {
    let (days, in_day) = (millis.div_euclid(86_400_000), millis.rem_euclid(86_400_000));
    let (year, month, day) = civil_from_days(days);
    let (h, m, s, ms) = (in_day / 3_600_000, in_day / 60_000 % 60, in_day / 1000 % 60, in_day % 1000);
    format!("{year:04}{month:02}{day:02}-{h:02}:{m:02}:{s:02}.{ms:03}")
}

fn digits(bytes: &[u8]) -> Option<u32> {
    if bytes.is_empty() || !bytes.iter().all(u8::is_ascii_digit) {
        return None;
    }
    Some(bytes.iter().fold(0u32, |n, &d| n * 10 + u32::from(d - b'0')))
}

/// Parses a UTCTimestamp (`YYYYMMDD-HH:MM:SS` with an optional fraction of
/// 1 to 9 digits, as the format check allows) into milliseconds since the
/// epoch, the fraction truncated to milliseconds; `None` if it is not one.
pub fn parse_timestamp(text: &[u8]) -> Option<i64> {
    if text.len() < 17 || text.len() == 18 || text.len() > 27 {
        return None;
    }
    if text[8] != b'-' || text[11] != b':' || text[14] != b':' {
        return None;
    }
    let year = digits(&text[0..4])?;
    let month = digits(&text[4..6])?;
    let day = digits(&text[6..8])?;
    let hour = digits(&text[9..11])?;
    let minute = digits(&text[12..14])?;
    let second = digits(&text[15..17])?;
    let millis = if text.len() > 17 {
        if text[17] != b'.' {
            return None;
        }
        let fraction = &text[18..];
        let whole = digits(fraction)?;
        // To milliseconds: pad a shorter fraction, cut a longer one.
        match fraction.len() {
            1 => whole * 100,
            2 => whole * 10,
            3 => whole,
            n => whole / 10u32.pow(n as u32 - 3),
        }
    } else {
        0
    };
    // Second 60 is a leap second, which FIX allows.
    if !(1..=12).contains(&month) || day == 0 || day > days_in_month(year, month) || hour > 23 || minute > 59 || second > 60 {
        return None;
    }
    let days = days_from_civil(i64::from(year), month, day);
    Some(days * 86_400_000 + i64::from(hour * 3_600_000 + minute * 60_000 + second * 1000 + millis))
}

fn days_in_month(year: u32, month: u32) -> u32 {
    match month {
        2 if (year.is_multiple_of(4) && !year.is_multiple_of(100)) || year.is_multiple_of(400) => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// A UTCDateOnly (`YYYYMMDD`) or LocalMktDate.
pub fn is_date(text: &[u8]) -> bool {
    text.len() == 8
        && digits(text).is_some()
        && matches!((digits(&text[0..4]), digits(&text[4..6]), digits(&text[6..8])), (Some(y), Some(m), Some(d)) if (1..=12).contains(&m) && d >= 1 && d <= days_in_month(y, m))
}

/// A UTCTimeOnly (`HH:MM:SS` with optional `.sss`).
pub fn is_time_only(text: &[u8]) -> bool {
    (text.len() == 8 || text.len() == 12)
        && text[2] == b':'
        && text[5] == b':'
        && matches!((digits(&text[0..2]), digits(&text[3..5]), digits(&text[6..8])), (Some(h), Some(m), Some(s)) if h < 24 && m < 60 && s <= 60)
        && (text.len() == 8 || (text[8] == b'.' && digits(&text[9..12]).is_some()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_instants() {
        assert_eq!(format_timestamp(0), "19700101-00:00:00.000");
        assert_eq!(format_timestamp(1_024_503_250_123), "20020619-16:14:10.123");
        assert_eq!(parse_timestamp(b"20020619-16:14:10.123"), Some(1_024_503_250_123));
        assert_eq!(parse_timestamp(b"20020619-16:14:10"), Some(1_024_503_250_000));
        assert_eq!(parse_timestamp(b"20000229-00:00:00"), Some(951_782_400_000));
        // A fraction of 1 to 9 digits, to the millisecond.
        assert_eq!(parse_timestamp(b"20020619-16:14:10.1"), Some(1_024_503_250_100));
        assert_eq!(parse_timestamp(b"20020619-16:14:10.12"), Some(1_024_503_250_120));
        assert_eq!(parse_timestamp(b"20020619-16:14:10.123456"), Some(1_024_503_250_123));
        assert_eq!(parse_timestamp(b"20020619-16:14:10.123456789"), Some(1_024_503_250_123));
        assert_eq!(parse_timestamp(b"20020619-16:14:10."), None);
        assert_eq!(parse_timestamp(b"20020619-16:14:10.1234567890"), None);
    }

    #[test]
    fn round_trips_over_centuries() {
        let mut millis = -5_000_000_000_000i64;
        while millis < 8_000_000_000_000 {
            let text = format_timestamp(millis);
            assert_eq!(parse_timestamp(text.as_bytes()), Some(millis), "{text}");
            millis += 7_777_777_777;
        }
    }

    #[test]
    fn rejects_what_is_not_a_timestamp() {
        for bad in ["20020619-16:14:1", "2002061916:14:10", "20021319-16:14:10", "20020230-16:14:10", "20020619-24:00:00", "20020619-16:14:10,000", "aaaaaaaa-16:14:10"] {
            assert_eq!(parse_timestamp(bad.as_bytes()), None, "{bad}");
        }
        assert!(is_date(b"20240229"));
        assert!(!is_date(b"20230229"));
        assert!(is_time_only(b"16:14:10.123"));
        assert!(!is_time_only(b"16:14"));
    }
}
