//! Retry policy: which failures are retried, backoff delays and `Retry-After`.

use std::hash::{BuildHasher, Hasher};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::LlmError;

/// Longest computed backoff delay.
pub(crate) const MAX_BACKOFF: Duration = Duration::from_secs(10);
/// Longest wait the client sleeps through itself before asking again; a
/// server that asks for longer gets [`LlmError::TryLater`], and the caller
/// decides (the orchestrator parks the turn).
pub(crate) const RETRY_WINDOW: Duration = Duration::from_secs(60);
/// Longest wait a server's hint is taken at (a week).
pub(crate) const MAX_WAIT: Duration = Duration::from_secs(7 * 24 * 3600);
/// How long an overloaded server (HTTP 529) that gave no hint is left alone.
pub(crate) const OVERLOADED_WAIT: Duration = Duration::from_secs(30);

/// Whether the client repeats a request that failed with `err` before any output was streamed:
/// connection failures, timeouts, broken streams, HTTP 408, 429 and 5xx. Other client errors,
/// malformed responses and configuration errors are final.
pub(crate) fn should_retry(err: &LlmError) -> bool {
    match err {
        LlmError::Connect { .. } | LlmError::Timeout { .. } | LlmError::Truncated(_) => true,
        LlmError::Http { status, .. } => matches!(*status, 408 | 429 | 500..=599),
        LlmError::TryLater { .. }
        | LlmError::Malformed(_)
        | LlmError::TooLarge(_)
        | LlmError::InvalidConfig(_) => false,
    }
}

/// The wait before retry number `retry` (1-based): `base · 2^(retry-1)`, at most
/// [`MAX_BACKOFF`], varied by up to ±10 % so that many clients do not retry in lockstep.
pub(crate) fn backoff(base: Duration, retry: u32) -> Duration {
    let exponent = retry.saturating_sub(1).min(20);
    let nominal = base.saturating_mul(1 << exponent).min(MAX_BACKOFF);
    // A factor in [0.9, 1.1).
    let factor = 0.9 + 0.2 * unit_random();
    nominal.mul_f64(factor).min(MAX_BACKOFF)
}

/// A pseudo-random number in [0, 1), good enough for jitter (no extra dependency).
fn unit_random() -> f64 {
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u128(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0),
    );
    (hasher.finish() >> 11) as f64 / (1u64 << 53) as f64
}

/// The wait a `Retry-After` header value asks for: delay-seconds or an HTTP date (relative to
/// `now`; a date in the past means no wait), at most [`MAX_WAIT`]. `None` when the value
/// is neither.
pub(crate) fn parse_retry_after(value: &str, now: SystemTime) -> Option<Duration> {
    let value = value.trim();
    let wait = if let Ok(secs) = value.parse::<u64>() {
        Duration::from_secs(secs)
    } else if let Some(secs) = value
        .parse::<f64>()
        .ok()
        .filter(|s| s.is_finite() && *s >= 0.0)
    {
        // Not allowed by RFC 9110, but sent by some servers.
        Duration::from_secs_f64(secs.min(MAX_WAIT.as_secs_f64()))
    } else {
        let at = parse_http_date(value)?;
        at.duration_since(now).unwrap_or(Duration::ZERO)
    };
    Some(wait.min(MAX_WAIT))
}

/// The wait a rate-limit reset header asks for: a duration as OpenAI
/// writes them (`1s`, `6m0s`, `1h2m3.5s`, `20ms`) or an RFC 3339 time as
/// Anthropic does (`2026-11-28T20:15:00Z`), at most [`MAX_WAIT`].
pub(crate) fn parse_reset(value: &str, now: SystemTime) -> Option<Duration> {
    let value = value.trim();
    let wait = match parse_go_duration(value) {
        Some(wait) => wait,
        None => parse_rfc3339(value)?
            .duration_since(now)
            .unwrap_or(Duration::ZERO),
    };
    Some(wait.min(MAX_WAIT))
}

/// `1h2m3.5s`, `6m0s`, `20ms`, `0.5s`.
fn parse_go_duration(value: &str) -> Option<Duration> {
    if value.is_empty() {
        return None;
    }
    let mut total = 0f64;
    let mut rest = value;
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        if digits == 0 {
            return None;
        }
        let number: f64 = rest[..digits].parse().ok()?;
        rest = &rest[digits..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let seconds = match &rest[..unit_len] {
            "h" => 3600.0,
            "m" => 60.0,
            "s" => 1.0,
            "ms" => 0.001,
            _ => return None,
        };
        total += number * seconds;
        rest = &rest[unit_len..];
    }
    (total.is_finite() && total >= 0.0)
        .then(|| Duration::from_secs_f64(total.min(MAX_WAIT.as_secs_f64())))
}

/// `2026-11-28T20:15:00Z`, `2026-11-28T20:15:00.5+01:00`.
fn parse_rfc3339(value: &str) -> Option<SystemTime> {
    let (date, time) = value.split_once(['T', 't'])?;
    let mut d = date.split('-');
    let year: i64 = d.next()?.parse().ok()?;
    let month: u32 = d.next()?.parse().ok()?;
    let day: u32 = d.next()?.parse().ok()?;
    if d.next().is_some() || !(1..=12).contains(&month) || !(1..=31).contains(&day) {
        return None;
    }
    let (clock, offset_secs) = if let Some(clock) = time.strip_suffix(['Z', 'z']) {
        (clock, 0i64)
    } else {
        let at = time.rfind(['+', '-'])?;
        let (clock, offset) = time.split_at(at);
        let sign = if offset.starts_with('-') { -1 } else { 1 };
        let (h, m) = offset[1..].split_once(':')?;
        let minutes = h.parse::<i64>().ok()? * 60 + m.parse::<i64>().ok()?;
        (clock, sign * minutes * 60)
    };
    let mut c = clock.split(':');
    let hour: i64 = c.next()?.parse().ok()?;
    let minute: i64 = c.next()?.parse().ok()?;
    let second: f64 = c.next()?.parse().ok()?;
    if c.next().is_some() || hour > 23 || minute > 59 || !(0.0..61.0).contains(&second) {
        return None;
    }
    let days = days_from_civil(year, month, day);
    let secs = days * 86_400 + hour * 3600 + minute * 60 - offset_secs;
    let at = secs as f64 + second;
    (at >= 0.0).then(|| UNIX_EPOCH + Duration::from_secs_f64(at))
}

/// Parses the three date formats HTTP recipients must accept (RFC 9110 §5.6.7):
/// `Sun, 06 Nov 1994 08:49:37 GMT`, `Sunday, 06-Nov-94 08:49:37 GMT` and
/// `Sun Nov  6 08:49:37 1994`.
pub(crate) fn parse_http_date(value: &str) -> Option<SystemTime> {
    let (day, month, year, time) = match value.split_once(',') {
        Some((_weekday, rest)) => {
            let parts: Vec<&str> = rest.split_whitespace().collect();
            match parts.as_slice() {
                // IMF-fixdate
                [day, month, year, time, "GMT"] => (
                    day.parse::<u32>().ok()?,
                    month_number(month)?,
                    year.parse::<i64>().ok()?,
                    *time,
                ),
                // RFC 850
                [date, time, "GMT"] => {
                    let mut fields = date.split('-');
                    let day = fields.next()?.parse::<u32>().ok()?;
                    let month = month_number(fields.next()?)?;
                    let yy = fields.next()?;
                    if fields.next().is_some() || yy.len() != 2 {
                        return None;
                    }
                    let yy = yy.parse::<i64>().ok()?;
                    let year = if yy < 70 { 2000 + yy } else { 1900 + yy };
                    (day, month, year, *time)
                }
                _ => return None,
            }
        }
        None => match value.split_whitespace().collect::<Vec<_>>().as_slice() {
            // asctime
            [_weekday, month, day, time, year] => (
                day.parse::<u32>().ok()?,
                month_number(month)?,
                year.parse::<i64>().ok()?,
                *time,
            ),
            _ => return None,
        },
    };
    let mut hms = time.split(':').map(|f| f.parse::<u32>().ok());
    let (hour, minute, second) = (hms.next()??, hms.next()??, hms.next()??);
    if hms.next().is_some() || hour > 23 || minute > 59 || second > 60 || !(1..=31).contains(&day) {
        return None;
    }
    let days = days_from_civil(year, month, day);
    let secs = days * 86_400 + i64::from(hour * 3600 + minute * 60 + second);
    let secs = u64::try_from(secs).ok()?;
    UNIX_EPOCH.checked_add(Duration::from_secs(secs))
}

fn month_number(name: &str) -> Option<u32> {
    const MONTHS: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    MONTHS
        .iter()
        .position(|m| m.eq_ignore_ascii_case(name))
        .and_then(|i| u32::try_from(i + 1).ok())
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's algorithm).
fn days_from_civil(year: i64, month: u32, day: u32) -> i64 {
    let year = if month <= 2 { year - 1 } else { year };
    let era = year.div_euclid(400);
    let year_of_era = year - era * 400;
    let month = i64::from(month);
    let shifted_month = if month > 2 { month - 3 } else { month + 9 };
    let day_of_year = (153 * shifted_month + 2) / 5 + i64::from(day) - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    era * 146_097 + day_of_era - 719_468
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn at(secs: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(secs)
    }

    #[test]
    fn backoff_doubles_from_the_base_and_is_capped() {
        let base = Duration::from_millis(500);
        for (retry, nominal_ms) in [(1, 500.0), (2, 1000.0), (3, 2000.0), (4, 4000.0)] {
            for _ in 0..20 {
                let d = backoff(base, retry).as_secs_f64() * 1000.0;
                assert!(
                    d >= nominal_ms * 0.9 - 0.001 && d <= nominal_ms * 1.1,
                    "retry {retry}: {d} ms"
                );
            }
        }
        assert!(backoff(base, 6) <= MAX_BACKOFF);
        assert!(backoff(base, 6) >= MAX_BACKOFF.mul_f64(0.9));
        assert!(backoff(base, 1000) <= MAX_BACKOFF);
        assert_eq!(backoff(Duration::ZERO, 3), Duration::ZERO);
    }

    #[test]
    fn backoff_has_jitter() {
        let delays: std::collections::HashSet<Duration> = (0..20)
            .map(|_| backoff(Duration::from_secs(1), 1))
            .collect();
        assert!(delays.len() > 1, "{delays:?}");
    }

    #[test]
    fn retry_after_in_seconds() {
        let now = at(1_000_000);
        assert_eq!(parse_retry_after("7", now), Some(Duration::from_secs(7)));
        assert_eq!(parse_retry_after(" 0 ", now), Some(Duration::ZERO));
        assert_eq!(
            parse_retry_after("1.5", now),
            Some(Duration::from_millis(1500))
        );
        assert_eq!(
            parse_retry_after("3600", now),
            Some(Duration::from_secs(3600))
        );
        assert_eq!(parse_retry_after("99999999", now), Some(MAX_WAIT));
        assert_eq!(parse_retry_after("-1", now), None);
        assert_eq!(parse_retry_after("soon", now), None);
        assert_eq!(parse_retry_after("", now), None);
    }

    #[test]
    fn http_dates_in_all_three_formats() {
        // 1994-11-06T08:49:37Z
        let expected = at(784_111_777);
        assert_eq!(
            parse_http_date("Sun, 06 Nov 1994 08:49:37 GMT"),
            Some(expected)
        );
        assert_eq!(
            parse_http_date("Sunday, 06-Nov-94 08:49:37 GMT"),
            Some(expected)
        );
        assert_eq!(parse_http_date("Sun Nov  6 08:49:37 1994"), Some(expected));
        assert_eq!(
            parse_http_date("Thu, 01 Jan 1970 00:00:00 GMT"),
            Some(UNIX_EPOCH)
        );
        // 2024-02-29T23:59:59Z (leap day)
        assert_eq!(
            parse_http_date("Thu, 29 Feb 2024 23:59:59 GMT"),
            Some(at(1_709_251_199))
        );
        assert_eq!(parse_http_date("Sun, 06 Nov 1994 08:49:37 CET"), None);
        assert_eq!(parse_http_date("Sun, 06 Foo 1994 08:49:37 GMT"), None);
        assert_eq!(parse_http_date("Sun, 06 Nov 1994 25:49:37 GMT"), None);
        assert_eq!(parse_http_date("Sun, 06 Nov 1994 08:49 GMT"), None);
    }

    #[test]
    fn retry_after_as_a_date_is_relative_to_now() {
        let now = at(784_111_770);
        assert_eq!(
            parse_retry_after("Sun, 06 Nov 1994 08:49:37 GMT", now),
            Some(Duration::from_secs(7))
        );
        // In the past: retry at once.
        assert_eq!(
            parse_retry_after("Sun, 06 Nov 1994 08:49:37 GMT", at(784_111_800)),
            Some(Duration::ZERO)
        );
        // Two hours on: the whole wait.
        assert_eq!(
            parse_retry_after("Sun, 06 Nov 1994 10:49:37 GMT", now),
            Some(Duration::from_secs(7207))
        );
    }

    #[test]
    fn rate_limit_resets_as_durations_and_times() {
        let now = at(784_111_770);
        assert_eq!(parse_reset("1s", now), Some(Duration::from_secs(1)));
        assert_eq!(parse_reset("6m0s", now), Some(Duration::from_secs(360)));
        assert_eq!(
            parse_reset("1h2m3.5s", now),
            Some(Duration::from_millis(3_723_500))
        );
        assert_eq!(parse_reset("20ms", now), Some(Duration::from_millis(20)));
        assert_eq!(
            parse_reset("1994-11-06T08:49:37Z", now),
            Some(Duration::from_secs(7))
        );
        assert_eq!(
            parse_reset("1994-11-06T09:49:37+01:00", now),
            Some(Duration::from_secs(7))
        );
        assert_eq!(
            parse_reset("1994-11-06T08:49:00Z", now),
            Some(Duration::ZERO)
        );
        for bad in [
            "",
            "soon",
            "5x",
            "s",
            "1994-13-06T08:49:37Z",
            "1994-11-06T08:49Z",
        ] {
            assert_eq!(parse_reset(bad, now), None, "{bad}");
        }
    }

    #[test]
    fn retry_policy() {
        let http = |status| LlmError::Http {
            status,
            message: String::new(),
        };
        for status in [408, 429, 500, 502, 503, 504] {
            assert!(should_retry(&http(status)), "{status}");
        }
        for status in [400, 401, 403, 404, 409, 413, 422] {
            assert!(!should_retry(&http(status)), "{status}");
        }
        assert!(should_retry(&LlmError::Connect {
            url: String::new(),
            reason: String::new()
        }));
        assert!(should_retry(&LlmError::Timeout {
            after: Duration::from_secs(1)
        }));
        assert!(should_retry(&LlmError::Truncated(String::new())));
        assert!(!should_retry(&LlmError::Malformed(String::new())));
        assert!(!should_retry(&LlmError::InvalidConfig(String::new())));
    }
}
