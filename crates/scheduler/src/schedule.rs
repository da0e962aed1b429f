//! The schedule math of reminders: parsing due times and cron recurrences,
//! and deciding what to fire when a reminder falls due.
//!
//! Nothing here reads a clock or does I/O: every function takes `now`, so
//! callers can inject a clock (and tests can simulate one).
//!
//! # Recurrences and daylight saving time
//!
//! A [`Recurrence`] is a standard 5-field crontab expression read in an
//! IANA time zone. Its occurrences are the local wall-clock times that match
//! the expression, turned into instants like this (the rules of RFC 5545):
//!
//! - a wall-clock time that happens twice (when clocks go back) fires once,
//!   at its first instant — except for expressions that fire in every hour
//!   of the day (`*/10 * * * *`), which fire in both passes of the repeated
//!   hour, so that they keep firing as real time passes;
//! - a wall-clock time that does not exist (when clocks go forward) is
//!   shifted forward by the length of the gap: `30 2 * * *` fires at 03:30
//!   on the day Paris skips from 02:00 to 03:00. Occurrences that land on
//!   the same instant fire once.

use chrono::{
    DateTime, Duration, LocalResult, Months, NaiveDate, NaiveDateTime, Offset, TimeZone, Utc,
};
use chrono_tz::Tz;
use std::iter::Peekable;
use std::str::FromStr;

/// How far ahead a due time may be, in months (10 years).
const MAX_AHEAD_MONTHS: u32 = 120;
/// How many occurrences [`plan`] looks at, at most, for one reminder.
const MAX_SCAN: usize = 10_000;
/// How many firings [`plan`] returns, at most, under [`MissedPolicy::All`].
const MAX_FIRINGS: usize = 1_000;
/// The expected forms of a due time, for error messages.
const DUE_FORMS: &str = "use an RFC 3339 time with an offset such as 2026-11-23T09:00:00+01:00, \
                         or a duration such as \"in 10m\", \"2h30m\" or \"in 2 hours\"";
/// The expected form of a cron expression, for error messages.
const CRON_FORM: &str = "use 5 fields: minute hour day-of-month month day-of-week";
/// Day-of-week names in crontab order (Sunday = 0).
const WEEKDAY_NAMES: [&str; 7] = ["Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat"];

/// Why a due time or a recurrence was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ScheduleError {
    /// The due time is neither an RFC 3339 time with an offset nor a duration.
    #[error("invalid due time {input:?}: {reason}")]
    InvalidDue {
        /// The text as given.
        input: String,
        /// What is wrong with it and what to write instead.
        reason: String,
    },
    /// The due time is not after `now`.
    #[error("due time {0} is in the past")]
    PastDue(String),
    /// The cron expression is not a valid 5-field crontab expression.
    #[error("invalid cron expression {input:?}: {reason}")]
    InvalidCron {
        /// The expression as given.
        input: String,
        /// What is wrong with it and what to write instead.
        reason: String,
    },
    /// The time zone is not an IANA time zone name.
    #[error("unknown time zone {0:?} (use an IANA name such as Europe/Paris)")]
    UnknownTimeZone(String),
    /// The due time is more than 10 years ahead.
    #[error("due time {0} is more than 10 years ahead")]
    TooFar(String),
}

/// What is wrong with one field of a cron expression (the expression's
/// [`ScheduleError::InvalidCron`] gives its reason).
#[derive(Debug)]
struct FieldError(String);

impl From<String> for FieldError {
    fn from(reason: String) -> Self {
        FieldError(reason)
    }
}

fn invalid_due(input: &str, reason: impl Into<String>) -> ScheduleError {
    ScheduleError::InvalidDue {
        input: input.to_string(),
        reason: reason.into(),
    }
}

/// Parses a due time, relative to `now`.
///
/// Accepted forms:
/// - an RFC 3339 time with an offset: `2026-11-23T09:00:00+01:00`,
///   `2026-11-23T08:00:00Z` (a time without an offset is refused: it would
///   be ambiguous);
/// - a duration from `now`, optionally after `in`: `in 10m`, `10m`,
///   `2h30m`, `1h 30m`, `90s`, `1d`, `1w`, `in 2 hours`, `in 5 minutes`,
///   `1 hour and 30 minutes`. Units (case-insensitive): `s`/`sec`/`secs`/
///   `second(s)`, `m`/`min`/`mins`/`minute(s)`, `h`/`hr`/`hrs`/`hour(s)`,
///   `d`/`day(s)`, `w`/`week(s)`. Amounts are whole numbers; a zero or
///   negative duration is refused.
///
/// # Errors
///
/// [`ScheduleError::InvalidDue`] for text in neither form,
/// [`ScheduleError::PastDue`] for a time not after `now`, and
/// [`ScheduleError::TooFar`] for a time more than 10 years after `now`.
pub fn parse_due(input: &str, now: DateTime<Utc>) -> Result<DateTime<Utc>, ScheduleError> {
    let text = input.trim();
    if text.is_empty() {
        return Err(invalid_due(input, format!("it is empty; {DUE_FORMS}")));
    }
    let due = if looks_like_timestamp(text) {
        parse_timestamp(input, text)?
    } else {
        let duration = parse_duration(input, text)?;
        now.checked_add_signed(duration)
            .ok_or_else(|| ScheduleError::TooFar(text.to_string()))?
    };
    if due <= now {
        return Err(ScheduleError::PastDue(text.to_string()));
    }
    match now.checked_add_months(Months::new(MAX_AHEAD_MONTHS)) {
        Some(limit) if due <= limit => Ok(due),
        Some(_) | None => Err(ScheduleError::TooFar(text.to_string())),
    }
}

/// Whether `text` starts like a date (`2026-`), as opposed to a duration.
fn looks_like_timestamp(text: &str) -> bool {
    match text.as_bytes() {
        [a, b, c, d, b'-', ..] => [a, b, c, d].iter().all(|x| x.is_ascii_digit()),
        _ => false,
    }
}

fn parse_timestamp(input: &str, text: &str) -> Result<DateTime<Utc>, ScheduleError> {
    match DateTime::parse_from_rfc3339(text) {
        Ok(time) => Ok(time.with_timezone(&Utc)),
        Err(error) => {
            let without_offset = [
                "%Y-%m-%dT%H:%M:%S%.f",
                "%Y-%m-%d %H:%M:%S%.f",
                "%Y-%m-%dT%H:%M",
                "%Y-%m-%d %H:%M",
            ]
            .iter()
            .any(|format| NaiveDateTime::parse_from_str(text, format).is_ok());
            let reason = if without_offset {
                "the time has no UTC offset, so it is ambiguous; add one such as \"Z\" or \"+01:00\" \
                 (for example 2026-11-23T09:00:00+01:00)"
                    .to_string()
            } else if NaiveDate::parse_from_str(text, "%Y-%m-%d").is_ok() {
                "a date alone is not a time; give a time and an offset too \
                 (for example 2026-11-23T09:00:00+01:00)"
                    .to_string()
            } else {
                format!("not a valid RFC 3339 time ({error}); {DUE_FORMS}")
            };
            Err(invalid_due(input, reason))
        }
    }
}

/// Seconds per unit, for the unit words a duration may use.
fn unit_seconds(unit: &str) -> Option<i64> {
    match unit {
        "s" | "sec" | "secs" | "second" | "seconds" => Some(1),
        "m" | "min" | "mins" | "minute" | "minutes" => Some(60),
        "h" | "hr" | "hrs" | "hour" | "hours" => Some(3_600),
        "d" | "day" | "days" => Some(86_400),
        "w" | "week" | "weeks" => Some(604_800),
        _ => None,
    }
}

fn parse_duration(input: &str, text: &str) -> Result<Duration, ScheduleError> {
    let lower = text.to_ascii_lowercase();
    let mut rest = lower.as_str();
    if let Some(after) = rest.strip_prefix("in")
        && after.starts_with(char::is_whitespace)
    {
        rest = after;
    }
    let too_far = || ScheduleError::TooFar(text.to_string());
    let mut total: i64 = 0;
    let mut parts = 0_usize;
    loop {
        rest = rest.trim_start_matches(|c: char| c.is_whitespace() || c == ',');
        if parts > 0
            && let Some(after) = rest.strip_prefix("and")
            && after.starts_with(|c: char| c.is_whitespace() || c.is_ascii_digit())
        {
            rest = after.trim_start();
        }
        if rest.is_empty() {
            break;
        }
        let digits = rest
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(rest.len());
        if digits == 0 {
            let reason = if rest.starts_with('-') {
                format!("a duration must be positive; {DUE_FORMS}")
            } else {
                format!("expected a number at {rest:?}; {DUE_FORMS}")
            };
            return Err(invalid_due(input, reason));
        }
        let (number, after_number) = rest.split_at(digits);
        let after_number = after_number.trim_start();
        let letters = after_number
            .find(|c: char| !c.is_ascii_alphabetic())
            .unwrap_or(after_number.len());
        let (unit, after_unit) = after_number.split_at(letters);
        if unit.is_empty() {
            let reason = if after_number.starts_with(['.', ',']) && parts == 0 {
                "use whole numbers, for example 1h30m instead of 1.5h".to_string()
            } else {
                format!("{number} has no unit; add one of s, m, h, d or w (for example {number}m)")
            };
            return Err(invalid_due(input, reason));
        }
        let Some(per_unit) = unit_seconds(unit) else {
            return Err(invalid_due(
                input,
                format!(
                    "unknown unit {unit:?}; use s/sec/second(s), m/min/minute(s), h/hr/hour(s), d/day(s) or w/week(s)"
                ),
            ));
        };
        let amount: i64 = number.parse().map_err(|_| too_far())?;
        total = amount
            .checked_mul(per_unit)
            .and_then(|seconds| total.checked_add(seconds))
            .ok_or_else(too_far)?;
        parts += 1;
        rest = after_unit;
    }
    if parts == 0 {
        return Err(invalid_due(
            input,
            format!("no duration given; {DUE_FORMS}"),
        ));
    }
    if total == 0 {
        return Err(invalid_due(
            input,
            "the duration is zero; give a time in the future",
        ));
    }
    Duration::try_seconds(total).ok_or_else(too_far)
}

/// When a reminder repeats: a 5-field crontab expression read in an IANA
/// time zone (see the [module documentation](self) for how daylight saving
/// time is handled).
///
/// The expression has the fields minute (0-59), hour (0-23), day of month
/// (1-31), month (1-12 or JAN-DEC) and day of week (0-7, 0 and 7 being
/// Sunday, or SUN-SAT); each field takes `*`, values, ranges `a-b`, lists
/// `a,b` and steps `*/n` or `a-b/n`. The macros `@yearly` (`@annually`),
/// `@monthly`, `@weekly`, `@daily` (`@midnight`) and `@hourly` are accepted
/// too. As in standard cron, when both the day of month and the day of week
/// are restricted (neither starts with `*`), a day matching either fires.
#[derive(Debug, Clone)]
pub struct Recurrence {
    /// The expression as given, with blanks normalised to single spaces.
    cron: String,
    time_zone: Tz,
    /// Schedules of the `cron` crate (seconds first, Sunday = 1) matching
    /// local wall-clock times, read as if they were UTC; their union is the
    /// recurrence (two schedules when day of month and day of week are
    /// both restricted, since the crate would require both to match).
    schedules: Vec<cron::Schedule>,
    /// Whether the expression fires in every hour of the day (such
    /// recurrences fire in both passes of a repeated hour).
    every_hour: bool,
}

impl Recurrence {
    /// Parses a 5-field crontab expression (or a macro such as `@daily`)
    /// read in the IANA time zone `time_zone` (empty means `UTC`).
    ///
    /// # Errors
    ///
    /// [`ScheduleError::UnknownTimeZone`] for a name that is not an IANA
    /// time zone, and [`ScheduleError::InvalidCron`] for an expression that
    /// is not a valid 5-field crontab expression (6 or 7 fields, with
    /// seconds or years, are refused).
    pub fn parse(cron5: &str, time_zone: &str) -> Result<Recurrence, ScheduleError> {
        let zone_name = match time_zone.trim() {
            "" => "UTC",
            name => name,
        };
        let zone = Tz::from_str(zone_name)
            .map_err(|_| ScheduleError::UnknownTimeZone(time_zone.to_string()))?;
        let invalid = |reason: String| ScheduleError::InvalidCron {
            input: cron5.to_string(),
            reason,
        };
        let words: Vec<&str> = cron5.split_whitespace().collect();
        let fields: [&str; 5] = match words.as_slice() {
            [] => {
                return Err(invalid(format!(
                    "it is empty; {CRON_FORM}, for example \"0 9 * * 1\""
                )));
            }
            [word] if word.starts_with('@') => expand_macro(word).map_err(|e| invalid(e.0))?,
            [minute, hour, day_of_month, month, day_of_week] => {
                [minute, hour, day_of_month, month, day_of_week]
            }
            other => {
                let count = other.len();
                let plural = if count == 1 { "" } else { "s" };
                return Err(invalid(format!(
                    "found {count} field{plural}; {CRON_FORM} (seconds and years are not supported)"
                )));
            }
        };
        let [minute, hour, day_of_month, month, day_of_week] = fields;
        for (spec, value) in [
            (&MINUTE, minute),
            (&HOUR, hour),
            (&DAY_OF_MONTH, day_of_month),
            (&MONTH, month),
            (&DAY_OF_WEEK, day_of_week),
        ] {
            if let Some(bad) = value
                .chars()
                .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '*' | ',' | '-' | '/')))
            {
                return Err(invalid(format!(
                    "the {} field {value:?} contains {bad:?}; use numbers, names, *, ranges (a-b), \
                     lists (a,b) and steps (*/n)",
                    spec.name
                )));
            }
        }
        let minutes = parse_field(&MINUTE, minute).map_err(|e| invalid(e.0))?;
        let hours = parse_field(&HOUR, hour).map_err(|e| invalid(e.0))?;
        let days_of_month = parse_field(&DAY_OF_MONTH, day_of_month).map_err(|e| invalid(e.0))?;
        let months = parse_field(&MONTH, month).map_err(|e| invalid(e.0))?;
        let mut days_of_week = parse_field(&DAY_OF_WEEK, day_of_week).map_err(|e| invalid(e.0))?;
        // 7 is Sunday too.
        if days_of_week.get(7).copied().unwrap_or(false)
            && let Some(sunday) = days_of_week.get_mut(0)
        {
            *sunday = true;
        }
        days_of_week.truncate(7);
        // The `cron` crate numbers days of the week from Sunday = 1; names
        // avoid any confusion.
        let crate_day_of_week = if days_of_week.iter().all(|&on| on) {
            "*".to_string()
        } else {
            WEEKDAY_NAMES
                .iter()
                .zip(&days_of_week)
                .filter_map(|(name, &on)| on.then_some(*name))
                .collect::<Vec<_>>()
                .join(",")
        };
        let crate_minute = crate_field(&minutes, MINUTE.min);
        let crate_hour = crate_field(&hours, HOUR.min);
        let crate_day_of_month = crate_field(&days_of_month, DAY_OF_MONTH.min);
        let crate_month = crate_field(&months, MONTH.min);
        // Standard cron: when both day fields are restricted (neither starts
        // with `*`), a day matching either fires; the crate requires both.
        let day_pairs: Vec<(&str, &str)> =
            if day_of_month.starts_with('*') || day_of_week.starts_with('*') {
                vec![(crate_day_of_month.as_str(), crate_day_of_week.as_str())]
            } else {
                vec![
                    (crate_day_of_month.as_str(), "*"),
                    ("*", crate_day_of_week.as_str()),
                ]
            };
        let mut schedules = Vec::with_capacity(day_pairs.len());
        for (dom, dow) in day_pairs {
            let expression = format!("0 {crate_minute} {crate_hour} {dom} {crate_month} {dow}");
            let schedule = cron::Schedule::from_str(&expression).map_err(|error| {
                invalid(format!(
                    "the cron engine refused it ({}); {CRON_FORM}",
                    error.to_string().replace('\n', " ")
                ))
            })?;
            schedules.push(schedule);
        }
        let every_hour = hours.iter().skip(HOUR.min).all(|&on| on);
        Ok(Recurrence {
            cron: words.join(" "),
            time_zone: zone,
            schedules,
            every_hour,
        })
    }

    /// The expression, as given (blanks normalised to single spaces).
    pub fn cron(&self) -> &str {
        &self.cron
    }

    /// The IANA name of the time zone the expression is read in.
    pub fn time_zone(&self) -> &str {
        self.time_zone.name()
    }

    /// The first occurrence strictly after `t`, or `None` when there is none
    /// (the expression never fires again, e.g. `0 0 30 2 *`, or only after
    /// 2100).
    pub fn next_after(&self, t: DateTime<Utc>) -> Option<DateTime<Utc>> {
        let offset_now = self.offset_at(t);
        let (lowest, _) = self.offsets_around(t);
        // Wall-clock times up to the size of a nearby offset change before
        // `t`'s own may still land after `t` (second pass of a repeated hour,
        // times shifted out of a gap), so the scan starts that much earlier.
        let back = (offset_now - lowest).max(Duration::zero());
        let start = t.naive_utc().checked_add_signed(offset_now - back)?;
        let mut best: Option<DateTime<Utc>> = None;
        let mut stop: Option<NaiveDateTime> = None;
        for local in self.local_matches_from(start) {
            if stop.is_some_and(|stop| local > stop) {
                break;
            }
            for instant in self.resolve(local).into_iter().flatten() {
                if instant > t && best.is_none_or(|best| instant < best) {
                    best = Some(instant);
                    // A wall-clock time never lands before itself minus the
                    // largest offset around, so later ones cannot beat `best`.
                    let (_, highest) = self.offsets_around(instant);
                    stop = instant.naive_utc().checked_add_signed(highest);
                }
            }
        }
        best
    }

    /// The UTC offset of the time zone at `t`.
    fn offset_at(&self, t: DateTime<Utc>) -> Duration {
        let offset = self
            .time_zone
            .offset_from_utc_datetime(&t.naive_utc())
            .fix();
        Duration::seconds(i64::from(offset.local_minus_utc()))
    }

    /// The lowest and highest UTC offsets within a day of `t`.
    fn offsets_around(&self, t: DateTime<Utc>) -> (Duration, Duration) {
        let here = self.offset_at(t);
        [
            t.checked_sub_signed(Duration::days(1)),
            t.checked_add_signed(Duration::days(1)),
        ]
        .into_iter()
        .flatten()
        .map(|x| self.offset_at(x))
        .fold((here, here), |(low, high), offset| {
            (low.min(offset), high.max(offset))
        })
    }

    /// The local wall-clock times at or after `start` that match the
    /// expression, in order, without duplicates.
    fn local_matches_from(&self, start: NaiveDateTime) -> impl Iterator<Item = NaiveDateTime> + '_ {
        let from = start
            .checked_sub_signed(Duration::seconds(1))
            .unwrap_or(start)
            .and_utc();
        let mut streams: Vec<Peekable<cron::ScheduleIterator<'_, Utc>>> = self
            .schedules
            .iter()
            .map(|schedule| schedule.after(&from).peekable())
            .collect();
        std::iter::from_fn(move || {
            let next = streams
                .iter_mut()
                .filter_map(|stream| stream.peek().copied())
                .min()?;
            for stream in &mut streams {
                if stream.peek() == Some(&next) {
                    stream.next();
                }
            }
            Some(next.naive_utc())
        })
    }

    /// The instants a matching local wall-clock time fires at (see the
    /// module documentation).
    fn resolve(&self, local: NaiveDateTime) -> [Option<DateTime<Utc>>; 2] {
        match self.time_zone.from_local_datetime(&local) {
            LocalResult::Single(time) => [Some(time.with_timezone(&Utc)), None],
            LocalResult::Ambiguous(a, b) => {
                let (first, second) = if a <= b { (a, b) } else { (b, a) };
                [
                    Some(first.with_timezone(&Utc)),
                    self.every_hour.then(|| second.with_timezone(&Utc)),
                ]
            }
            LocalResult::None => {
                // In a gap: read it with the offset in force before the gap,
                // which shifts it forward by the length of the gap.
                let before = local
                    .and_utc()
                    .checked_sub_signed(Duration::days(1))
                    .map(|probe| self.offset_at(probe));
                let shifted = before.and_then(|offset| local.checked_sub_signed(offset));
                [shifted.map(|naive| naive.and_utc()), None]
            }
        }
    }
}

/// Expands a crontab macro into its 5 fields.
fn expand_macro(word: &str) -> Result<[&'static str; 5], FieldError> {
    match word.to_ascii_lowercase().as_str() {
        "@yearly" | "@annually" => Ok(["0", "0", "1", "1", "*"]),
        "@monthly" => Ok(["0", "0", "1", "*", "*"]),
        "@weekly" => Ok(["0", "0", "*", "*", "0"]),
        "@daily" | "@midnight" => Ok(["0", "0", "*", "*", "*"]),
        "@hourly" => Ok(["0", "*", "*", "*", "*"]),
        "@reboot" => Err(FieldError(format!(
            "@reboot is not a schedule; {CRON_FORM}"
        ))),
        _ => Err(FieldError(format!(
            "unknown macro {word}; use @yearly, @annually, @monthly, @weekly, @daily, @midnight or @hourly, \
             or {CRON_FORM}"
        ))),
    }
}

/// One field of a crontab expression: its range of values and names.
struct FieldSpec {
    /// The field's name in messages.
    name: &'static str,
    min: usize,
    max: usize,
    /// Names of values, lower case.
    names: &'static [(&'static str, usize)],
    /// What the field accepts, for messages.
    accepts: &'static str,
}

const MINUTE: FieldSpec = FieldSpec {
    name: "minute",
    min: 0,
    max: 59,
    names: &[],
    accepts: "0-59",
};
const HOUR: FieldSpec = FieldSpec {
    name: "hour",
    min: 0,
    max: 23,
    names: &[],
    accepts: "0-23",
};
const DAY_OF_MONTH: FieldSpec = FieldSpec {
    name: "day-of-month",
    min: 1,
    max: 31,
    names: &[],
    accepts: "1-31",
};
const MONTH: FieldSpec = FieldSpec {
    name: "month",
    min: 1,
    max: 12,
    names: &[
        ("jan", 1),
        ("january", 1),
        ("feb", 2),
        ("february", 2),
        ("mar", 3),
        ("march", 3),
        ("apr", 4),
        ("april", 4),
        ("may", 5),
        ("jun", 6),
        ("june", 6),
        ("jul", 7),
        ("july", 7),
        ("aug", 8),
        ("august", 8),
        ("sep", 9),
        ("sept", 9),
        ("september", 9),
        ("oct", 10),
        ("october", 10),
        ("nov", 11),
        ("november", 11),
        ("dec", 12),
        ("december", 12),
    ],
    accepts: "1-12 or JAN-DEC",
};
const DAY_OF_WEEK: FieldSpec = FieldSpec {
    name: "day-of-week",
    min: 0,
    max: 7,
    names: &[
        ("sun", 0),
        ("sunday", 0),
        ("mon", 1),
        ("monday", 1),
        ("tue", 2),
        ("tues", 2),
        ("tuesday", 2),
        ("wed", 3),
        ("wednesday", 3),
        ("thu", 4),
        ("thur", 4),
        ("thurs", 4),
        ("thursday", 4),
        ("fri", 5),
        ("friday", 5),
        ("sat", 6),
        ("saturday", 6),
    ],
    accepts: "0-7 (0 and 7 are Sunday) or SUN-SAT",
};

/// Parses one crontab field (`*`, values, ranges `a-b`, lists `a,b`, steps
/// `*/n`, `a-b/n` and `a/n`, which runs to the end of the range) into the
/// values it selects: `result[v]` says whether value `v` is selected.
fn parse_field(spec: &FieldSpec, text: &str) -> Result<Vec<bool>, FieldError> {
    let name = spec.name;
    let mut selected = vec![false; spec.max + 1];
    for item in text.split(',') {
        if item.is_empty() {
            return Err(FieldError(format!(
                "the {name} field {text:?} has an empty list item"
            )));
        }
        let (range, step) = match item.split_once('/') {
            Some((range, step)) => match step.parse::<usize>() {
                Ok(step) if step > 0 => (range, Some(step)),
                Ok(_) | Err(_) => {
                    return Err(FieldError(format!(
                        "the step in the {name} field {item:?} must be a whole number of at least 1"
                    )));
                }
            },
            None => (item, None),
        };
        let (start, end) = if range == "*" {
            (spec.min, spec.max)
        } else if let Some((first, last)) = range.split_once('-') {
            let start = field_value(spec, first)?;
            match field_value(spec, last)? {
                // SAT-SUN: Sunday at the end of a range is day 7.
                0 if spec.max == 7 && start > 0 => (start, 7),
                end if end >= start => (start, end),
                _ => {
                    return Err(FieldError(format!(
                        "the {name} range {range:?} runs backwards; split it into two ranges"
                    )));
                }
            }
        } else {
            let value = field_value(spec, range)?;
            match step {
                Some(_) => (value, spec.max),
                None => (value, value),
            }
        };
        for value in (start..=end).step_by(step.unwrap_or(1)) {
            if let Some(slot) = selected.get_mut(value) {
                *slot = true;
            }
        }
    }
    Ok(selected)
}

/// One value of a field, as a number or a name.
fn field_value(spec: &FieldSpec, text: &str) -> Result<usize, FieldError> {
    let (name, accepts) = (spec.name, spec.accepts);
    if !text.is_empty() && text.chars().all(|c| c.is_ascii_digit()) {
        return match text.parse::<usize>() {
            Ok(value) if (spec.min..=spec.max).contains(&value) => Ok(value),
            Ok(_) | Err(_) => Err(FieldError(format!(
                "{text} is out of range for the {name} field; use {accepts}"
            ))),
        };
    }
    let lower = text.to_ascii_lowercase();
    match spec.names.iter().find(|(known, _)| *known == lower) {
        Some(&(_, value)) => Ok(value),
        None if spec.names.is_empty() => Err(FieldError(format!(
            "the {name} field takes numbers ({accepts}), not {text:?}"
        ))),
        None => Err(FieldError(format!(
            "{text:?} is not valid in the {name} field; use {accepts}"
        ))),
    }
}

/// The `cron` crate's spelling of the values selected in a field (other
/// than day of week): `*` for all of them, else a list.
fn crate_field(selected: &[bool], min: usize) -> String {
    if selected.iter().skip(min).all(|&on| on) {
        return "*".to_string();
    }
    selected
        .iter()
        .enumerate()
        .filter(|&(_, &on)| on)
        .map(|(value, _)| value.to_string())
        .collect::<Vec<_>>()
        .join(",")
}

/// What to do with the occurrences of a recurring reminder that were missed
/// (the scheduler was down, or late by more than the grace period).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MissedPolicy {
    /// Fire once for all of them, at the latest, counting them.
    Once,
    /// Fire once per occurrence, oldest first.
    All,
    /// Fire only the latest, and only if it is recent.
    Skip,
}

/// One firing to make.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlannedFiring {
    /// The occurrence the firing is for (the latest, when it stands for
    /// several).
    pub due: DateTime<Utc>,
    /// How many occurrences the firing stands for (at least 1).
    pub occurrences: u32,
}

/// What to do for a reminder that fell due.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// The firings to make, oldest first (possibly none).
    pub fire: Vec<PlannedFiring>,
    /// When the reminder falls due next, or `None` when it is finished.
    pub next_due: Option<DateTime<Utc>>,
}

/// Decides what to do for a reminder whose stored due time is `due`, at
/// `now` (callers call it when `now >= due`; before that it fires nothing
/// and keeps `due`).
///
/// - A one-shot reminder (`recurrence` is `None`) fires once,
///   `{due, occurrences: 1}`, and is finished (`next_due` is `None`).
/// - A recurring reminder's occurrences are `due` and every later occurrence
///   up to `now` (at most 10 000 are looked at); `next_due` is the first
///   occurrence after `now`. A single occurrence no older than `grace` is on
///   time and always fires. Otherwise occurrences were missed and `missed`
///   decides: [`MissedPolicy::Once`] fires once at the latest occurrence,
///   counting them all; [`MissedPolicy::All`] fires once per occurrence,
///   oldest first (at most 1000 firings: the last one then stands for the
///   rest, is due at the latest occurrence and counts them);
///   [`MissedPolicy::Skip`] fires the latest occurrence alone if it is no
///   older than `grace`, and nothing otherwise.
pub fn plan(
    due: DateTime<Utc>,
    recurrence: Option<&Recurrence>,
    missed: MissedPolicy,
    now: DateTime<Utc>,
    grace: Duration,
) -> Plan {
    if now < due {
        return Plan {
            fire: Vec::new(),
            next_due: Some(due),
        };
    }
    let Some(recurrence) = recurrence else {
        return Plan {
            fire: vec![PlannedFiring {
                due,
                occurrences: 1,
            }],
            next_due: None,
        };
    };
    let mut occurrences = vec![due];
    let mut latest = due;
    let next_due = loop {
        if occurrences.len() >= MAX_SCAN {
            break recurrence.next_after(now);
        }
        match recurrence.next_after(latest) {
            Some(next) if next <= now => {
                occurrences.push(next);
                latest = next;
            }
            after_now => break after_now,
        }
    };
    let count = u32::try_from(occurrences.len()).unwrap_or(u32::MAX);
    let recent = |at: DateTime<Utc>| now.signed_duration_since(at) <= grace;
    let single = |due: DateTime<Utc>| PlannedFiring {
        due,
        occurrences: 1,
    };
    let fire = if count == 1 && recent(due) {
        vec![single(due)]
    } else {
        match missed {
            MissedPolicy::Once => vec![PlannedFiring {
                due: latest,
                occurrences: count,
            }],
            MissedPolicy::All if occurrences.len() <= MAX_FIRINGS => {
                occurrences.into_iter().map(single).collect()
            }
            MissedPolicy::All => {
                let kept = MAX_FIRINGS - 1;
                let mut fire: Vec<PlannedFiring> =
                    occurrences.into_iter().take(kept).map(single).collect();
                fire.push(PlannedFiring {
                    due: latest,
                    occurrences: count.saturating_sub(u32::try_from(kept).unwrap_or(u32::MAX)),
                });
                fire
            }
            MissedPolicy::Skip if recent(latest) => vec![single(latest)],
            MissedPolicy::Skip => Vec::new(),
        }
    };
    Plan { fire, next_due }
}

/// The first due time of a recurring reminder created at `now`: its first
/// occurrence after `now`.
pub fn first_due(recurrence: &Recurrence, now: DateTime<Utc>) -> Option<DateTime<Utc>> {
    recurrence.next_after(now)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use chrono::{Datelike, Weekday};
    use pretty_assertions::assert_eq;

    fn t(text: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(text)
            .unwrap()
            .with_timezone(&Utc)
    }

    fn now() -> DateTime<Utc> {
        t("2026-11-23T08:00:00Z")
    }

    fn rec(cron: &str, zone: &str) -> Recurrence {
        Recurrence::parse(cron, zone).unwrap()
    }

    /// The first `n` occurrences after `from`.
    fn upcoming(recurrence: &Recurrence, from: &str, n: usize) -> Vec<DateTime<Utc>> {
        let mut out = Vec::new();
        let mut cursor = t(from);
        while out.len() < n {
            cursor = recurrence.next_after(cursor).unwrap();
            out.push(cursor);
        }
        out
    }

    fn times(list: &[&str]) -> Vec<DateTime<Utc>> {
        list.iter().map(|x| t(x)).collect()
    }

    fn invalid_due_reason(input: &str) -> String {
        match parse_due(input, now()) {
            Err(ScheduleError::InvalidDue { input: got, reason }) => {
                assert_eq!(got, input);
                reason
            }
            other => panic!("{input:?}: expected InvalidDue, got {other:?}"),
        }
    }

    fn invalid_cron_reason(cron: &str) -> String {
        match Recurrence::parse(cron, "UTC") {
            Err(ScheduleError::InvalidCron { input, reason }) => {
                assert_eq!(input, cron);
                reason
            }
            other => panic!("{cron:?}: expected InvalidCron, got {other:?}"),
        }
    }

    // ---- parse_due ----

    #[test]
    fn rfc3339_times_are_converted_to_utc() {
        let cases = [
            ("2026-11-23T09:00:00+01:00", "2026-11-23T08:00:00Z"),
            ("2026-11-23T09:00:00Z", "2026-11-23T09:00:00Z"),
            ("2026-11-23T09:00:00z", "2026-11-23T09:00:00Z"),
            ("2026-11-23T04:30:00-05:00", "2026-11-23T09:30:00Z"),
            ("2026-11-24T00:15:00+05:30", "2026-11-23T18:45:00Z"),
            ("2026-11-23T09:00:00.250+01:00", "2026-11-23T08:00:00.250Z"),
            ("  2026-11-23T09:00:00+01:00  ", "2026-11-23T08:00:00Z"),
        ];
        for (input, expected) in cases {
            let midnight = t("2026-11-23T00:00:00Z");
            assert_eq!(parse_due(input, midnight), Ok(t(expected)), "{input}");
        }
    }

    #[test]
    fn times_without_offset_are_refused_with_a_clear_message() {
        let reason = "the time has no UTC offset, so it is ambiguous; add one such as \"Z\" or \"+01:00\" \
                      (for example 2026-11-23T09:00:00+01:00)";
        for input in [
            "2026-11-23T09:00:00",
            "2026-11-23 09:00:00",
            "2026-11-23T09:00",
            "2026-11-23T09:00:00.5",
        ] {
            assert_eq!(invalid_due_reason(input), reason, "{input}");
        }
        assert_eq!(
            invalid_due_reason("2026-11-23"),
            "a date alone is not a time; give a time and an offset too (for example 2026-11-23T09:00:00+01:00)"
        );
        assert!(
            invalid_due_reason("2026-13-45T99:00:00Z").starts_with("not a valid RFC 3339 time (")
        );
    }

    #[test]
    fn durations_are_added_to_now() {
        let cases = [
            ("in 10m", 600),
            ("10m", 600),
            ("2h30m", 9_000),
            ("1h 30m", 5_400),
            ("90s", 90),
            ("1d", 86_400),
            ("1w", 604_800),
            ("in 2 hours", 7_200),
            ("in 5 minutes", 300),
            ("IN 5 MINUTES", 300),
            ("In 1 Hour", 3_600),
            ("1 hour and 30 minutes", 5_400),
            ("1h, 30m", 5_400),
            ("1 sec", 1),
            ("2 secs", 2),
            ("1 second", 1),
            ("3 seconds", 3),
            ("1min", 60),
            ("2 mins", 120),
            ("1 minute", 60),
            ("2hr", 7_200),
            ("2 hrs", 7_200),
            ("1 day", 86_400),
            ("2 days", 172_800),
            ("1 week", 604_800),
            ("2 weeks", 1_209_600),
            ("1d2h3m4s", 93_784),
            ("0h5m", 300),
        ];
        for (input, seconds) in cases {
            assert_eq!(
                parse_due(input, now()),
                Ok(now() + Duration::seconds(seconds)),
                "{input}"
            );
        }
    }

    #[test]
    fn bad_durations_are_refused_with_a_clear_message() {
        assert_eq!(
            invalid_due_reason("0m"),
            "the duration is zero; give a time in the future"
        );
        assert_eq!(
            invalid_due_reason("in 0 hours"),
            "the duration is zero; give a time in the future"
        );
        let positive = format!("a duration must be positive; {DUE_FORMS}");
        assert_eq!(invalid_due_reason("-5m"), positive);
        assert_eq!(invalid_due_reason("in -5m"), positive);
        assert_eq!(
            invalid_due_reason("10"),
            "10 has no unit; add one of s, m, h, d or w (for example 10m)"
        );
        assert_eq!(
            invalid_due_reason("1.5h"),
            "use whole numbers, for example 1h30m instead of 1.5h"
        );
        assert_eq!(
            invalid_due_reason("10 fortnights"),
            "unknown unit \"fortnights\"; use s/sec/second(s), m/min/minute(s), h/hr/hour(s), d/day(s) or w/week(s)"
        );
        assert_eq!(
            invalid_due_reason("tomorrow"),
            format!("expected a number at \"tomorrow\"; {DUE_FORMS}")
        );
        assert_eq!(
            invalid_due_reason("in"),
            format!("expected a number at \"in\"; {DUE_FORMS}")
        );
        assert_eq!(
            invalid_due_reason("   "),
            format!("it is empty; {DUE_FORMS}")
        );
        assert_eq!(
            parse_due("", now()).unwrap_err().to_string(),
            format!("invalid due time \"\": it is empty; {DUE_FORMS}")
        );
    }

    #[test]
    fn past_and_present_times_are_refused() {
        assert_eq!(
            parse_due("2026-11-23T07:59:59Z", now()),
            Err(ScheduleError::PastDue("2026-11-23T07:59:59Z".into()))
        );
        assert_eq!(
            parse_due("2026-11-23T09:00:00+01:00", now()),
            Err(ScheduleError::PastDue("2026-11-23T09:00:00+01:00".into()))
        );
        assert_eq!(
            parse_due("2020-01-01T00:00:00Z", now())
                .unwrap_err()
                .to_string(),
            "due time 2020-01-01T00:00:00Z is in the past"
        );
        assert_eq!(
            parse_due("2026-11-23T08:00:01Z", now()),
            Ok(t("2026-11-23T08:00:01Z"))
        );
    }

    #[test]
    fn times_more_than_ten_years_ahead_are_refused() {
        assert_eq!(
            parse_due("2036-11-23T08:00:00Z", now()),
            Ok(t("2036-11-23T08:00:00Z"))
        );
        assert_eq!(
            parse_due("2036-11-23T08:00:01Z", now()),
            Err(ScheduleError::TooFar("2036-11-23T08:00:01Z".into()))
        );
        assert_eq!(
            parse_due("in 521w", now()),
            Ok(now() + Duration::weeks(521))
        );
        assert_eq!(
            parse_due("in 600 weeks", now()),
            Err(ScheduleError::TooFar("in 600 weeks".into()))
        );
        assert_eq!(
            parse_due("in 600 weeks", now()).unwrap_err().to_string(),
            "due time in 600 weeks is more than 10 years ahead"
        );
        for huge in [
            "99999999999999999999999d",
            "9223372036854775807w",
            "in 9223372036854775807s",
        ] {
            assert_eq!(
                parse_due(huge, now()),
                Err(ScheduleError::TooFar(huge.into())),
                "{huge}"
            );
        }
    }

    // ---- Recurrence ----

    #[test]
    fn monday_nine_am_in_paris_is_eight_utc_in_winter_and_seven_in_summer() {
        let mondays = rec("0 9 * * 1", "Europe/Paris");
        let winter = upcoming(&mondays, "2026-01-01T00:00:00Z", 2);
        assert_eq!(
            winter,
            times(&["2026-01-05T08:00:00Z", "2026-01-12T08:00:00Z"])
        );
        let summer = upcoming(&mondays, "2026-07-01T00:00:00Z", 2);
        assert_eq!(
            summer,
            times(&["2026-07-06T07:00:00Z", "2026-07-13T07:00:00Z"])
        );
        for time in winter.iter().chain(&summer) {
            let local = time.with_timezone(&chrono_tz::Europe::Paris);
            assert_eq!(local.weekday(), Weekday::Mon);
            assert_eq!(local.format("%H:%M").to_string(), "09:00");
        }
        // Monday 09:00 exactly is not after itself.
        assert_eq!(
            mondays.next_after(t("2026-01-05T08:00:00Z")),
            Some(t("2026-01-12T08:00:00Z"))
        );
        assert_eq!(
            mondays.next_after(t("2026-01-05T07:59:59Z")),
            Some(t("2026-01-05T08:00:00Z"))
        );
    }

    #[test]
    fn every_day_of_week_number_and_name_matches_standard_crontab() {
        // 2026-01-04 is a Sunday.
        let expected = [
            (Weekday::Sun, "2026-01-04T09:00:00Z"),
            (Weekday::Mon, "2026-01-05T09:00:00Z"),
            (Weekday::Tue, "2026-01-06T09:00:00Z"),
            (Weekday::Wed, "2026-01-07T09:00:00Z"),
            (Weekday::Thu, "2026-01-08T09:00:00Z"),
            (Weekday::Fri, "2026-01-09T09:00:00Z"),
            (Weekday::Sat, "2026-01-10T09:00:00Z"),
        ];
        for (number, (weekday, time)) in expected.iter().enumerate() {
            let name = WEEKDAY_NAMES[number];
            for field in [
                number.to_string(),
                name.to_string(),
                name.to_uppercase(),
                name.to_lowercase(),
            ] {
                let got =
                    rec(&format!("0 9 * * {field}"), "UTC").next_after(t("2026-01-03T12:00:00Z"));
                assert_eq!(got, Some(t(time)), "day of week {field}");
                assert_eq!(got.unwrap().weekday(), *weekday);
            }
        }
        let sunday_seven = rec("0 9 * * 7", "UTC").next_after(t("2026-01-03T12:00:00Z"));
        assert_eq!(sunday_seven, Some(t("2026-01-04T09:00:00Z")));
        let full_names = rec("0 9 * * Monday,friday", "UTC");
        assert_eq!(
            upcoming(&full_names, "2026-01-03T12:00:00Z", 2),
            times(&["2026-01-05T09:00:00Z", "2026-01-09T09:00:00Z"])
        );
    }

    #[test]
    fn ranges_lists_and_steps_of_days_of_week() {
        let from = "2026-01-03T12:00:00Z"; // a Saturday
        let weekdays = |cron: &str| -> Vec<Weekday> {
            upcoming(&rec(cron, "UTC"), from, 7)
                .iter()
                .map(|x| x.weekday())
                .collect()
        };
        use Weekday::{Fri, Mon, Sat, Sun, Thu, Tue, Wed};
        assert_eq!(
            weekdays("0 9 * * 1-5"),
            vec![Mon, Tue, Wed, Thu, Fri, Mon, Tue]
        );
        assert_eq!(
            weekdays("0 9 * * MON-FRI"),
            vec![Mon, Tue, Wed, Thu, Fri, Mon, Tue]
        );
        assert_eq!(
            weekdays("0 9 * * 1,3,5"),
            vec![Mon, Wed, Fri, Mon, Wed, Fri, Mon]
        );
        assert_eq!(
            weekdays("0 9 * * SAT,SUN"),
            vec![Sun, Sat, Sun, Sat, Sun, Sat, Sun]
        );
        assert_eq!(
            weekdays("0 9 * * SAT-SUN"),
            vec![Sun, Sat, Sun, Sat, Sun, Sat, Sun]
        );
        assert_eq!(
            weekdays("0 9 * * 6-7"),
            vec![Sun, Sat, Sun, Sat, Sun, Sat, Sun]
        );
        assert_eq!(
            weekdays("0 9 * * 5-7"),
            vec![Sun, Fri, Sat, Sun, Fri, Sat, Sun]
        );
        assert_eq!(
            weekdays("0 9 * * 0-6"),
            vec![Sun, Mon, Tue, Wed, Thu, Fri, Sat]
        );
        assert_eq!(
            weekdays("0 9 * * */2"),
            vec![Sun, Tue, Thu, Sat, Sun, Tue, Thu]
        );
        assert_eq!(
            weekdays("0 9 * * 1-5/2"),
            vec![Mon, Wed, Fri, Mon, Wed, Fri, Mon]
        );
        // `a/n` runs to the end of the week: 1, 4, 7 (Sunday).
        assert_eq!(
            weekdays("0 9 * * 1/3"),
            vec![Sun, Mon, Thu, Sun, Mon, Thu, Sun]
        );
        assert_eq!(
            weekdays("0 9 * * *"),
            vec![Sun, Mon, Tue, Wed, Thu, Fri, Sat]
        );
    }

    #[test]
    fn minute_hour_day_and_month_fields() {
        assert_eq!(
            upcoming(&rec("*/15 * * * *", "UTC"), "2026-01-01T10:07:00Z", 4),
            times(&[
                "2026-01-01T10:15:00Z",
                "2026-01-01T10:30:00Z",
                "2026-01-01T10:45:00Z",
                "2026-01-01T11:00:00Z",
            ])
        );
        assert_eq!(
            upcoming(&rec("30 9-11 * * *", "UTC"), "2026-01-01T10:00:00Z", 3),
            times(&[
                "2026-01-01T10:30:00Z",
                "2026-01-01T11:30:00Z",
                "2026-01-02T09:30:00Z"
            ])
        );
        assert_eq!(
            upcoming(&rec("0 8,20 * * *", "UTC"), "2026-01-01T10:00:00Z", 3),
            times(&[
                "2026-01-01T20:00:00Z",
                "2026-01-02T08:00:00Z",
                "2026-01-02T20:00:00Z"
            ])
        );
        assert_eq!(
            upcoming(&rec("0 0 1 JAN,jul *", "UTC"), "2026-01-01T10:00:00Z", 3),
            times(&[
                "2026-07-01T00:00:00Z",
                "2027-01-01T00:00:00Z",
                "2027-07-01T00:00:00Z"
            ])
        );
        assert_eq!(
            upcoming(
                &rec("0 12 */10 FEB-MAR *", "UTC"),
                "2026-01-01T00:00:00Z",
                4
            ),
            times(&[
                "2026-02-01T12:00:00Z",
                "2026-02-11T12:00:00Z",
                "2026-02-21T12:00:00Z",
                "2026-03-01T12:00:00Z",
            ])
        );
        // 2028 is a leap year.
        assert_eq!(
            upcoming(&rec("0 0 29 2 *", "UTC"), "2026-01-01T00:00:00Z", 2),
            times(&["2028-02-29T00:00:00Z", "2032-02-29T00:00:00Z"])
        );
        assert_eq!(
            rec("0 0 30 2 *", "UTC").next_after(t("2026-01-01T00:00:00Z")),
            None
        );
    }

    #[test]
    fn day_of_month_and_day_of_week_both_restricted_match_either() {
        // The 13th, and every Friday (2026-02-13 is a Friday).
        assert_eq!(
            upcoming(&rec("0 0 13 * 5", "UTC"), "2026-02-01T00:00:00Z", 5),
            times(&[
                "2026-02-06T00:00:00Z",
                "2026-02-13T00:00:00Z",
                "2026-02-20T00:00:00Z",
                "2026-02-27T00:00:00Z",
                "2026-03-06T00:00:00Z",
            ])
        );
        assert_eq!(
            upcoming(&rec("0 0 1,15 * MON", "UTC"), "2026-06-20T00:00:00Z", 5),
            times(&[
                "2026-06-22T00:00:00Z", // Monday
                "2026-06-29T00:00:00Z", // Monday
                "2026-07-01T00:00:00Z", // the 1st, a Wednesday
                "2026-07-06T00:00:00Z", // Monday
                "2026-07-13T00:00:00Z", // Monday
            ])
        );
        // A `*`-prefixed day field narrows instead, as in standard cron.
        assert_eq!(
            upcoming(&rec("0 0 */2 * MON", "UTC"), "2026-06-01T00:00:00Z", 3),
            times(&[
                "2026-06-15T00:00:00Z",
                "2026-06-29T00:00:00Z",
                "2026-07-13T00:00:00Z"
            ])
        );
    }

    #[test]
    fn macros() {
        let from = "2026-03-15T10:30:00Z"; // a Sunday
        let cases = [
            ("@hourly", ["2026-03-15T11:00:00Z", "2026-03-15T12:00:00Z"]),
            ("@daily", ["2026-03-16T00:00:00Z", "2026-03-17T00:00:00Z"]),
            (
                "@midnight",
                ["2026-03-16T00:00:00Z", "2026-03-17T00:00:00Z"],
            ),
            ("@weekly", ["2026-03-22T00:00:00Z", "2026-03-29T00:00:00Z"]),
            ("@monthly", ["2026-04-01T00:00:00Z", "2026-05-01T00:00:00Z"]),
            ("@yearly", ["2027-01-01T00:00:00Z", "2028-01-01T00:00:00Z"]),
            (
                "@annually",
                ["2027-01-01T00:00:00Z", "2028-01-01T00:00:00Z"],
            ),
            ("@DAILY", ["2026-03-16T00:00:00Z", "2026-03-17T00:00:00Z"]),
        ];
        for (cron, expected) in cases {
            assert_eq!(
                upcoming(&rec(cron, "UTC"), from, 2),
                times(&expected),
                "{cron}"
            );
        }
        // Read in the time zone.
        assert_eq!(
            rec("@daily", "Europe/Paris").next_after(t(from)),
            Some(t("2026-03-15T23:00:00Z"))
        );
    }

    #[test]
    fn accessors_and_time_zone_default() {
        let r = rec("  0  9 * *   MON ", "Europe/Paris");
        assert_eq!(r.cron(), "0 9 * * MON");
        assert_eq!(r.time_zone(), "Europe/Paris");
        assert_eq!(rec("@daily", "").time_zone(), "UTC");
        assert_eq!(rec("@daily", "  ").time_zone(), "UTC");
        assert_eq!(rec("@daily", "").cron(), "@daily");
        assert_eq!(
            rec("0 9 * * *", "America/New_York").time_zone(),
            "America/New_York"
        );
    }

    #[test]
    fn unknown_time_zones_are_refused() {
        for zone in ["Mars/Olympus", "CEST", "europe/paris", "+01:00"] {
            assert_eq!(
                Recurrence::parse("0 9 * * *", zone).unwrap_err(),
                ScheduleError::UnknownTimeZone(zone.into()),
                "{zone}"
            );
        }
        assert_eq!(
            Recurrence::parse("0 9 * * *", "Mars/Olympus")
                .unwrap_err()
                .to_string(),
            "unknown time zone \"Mars/Olympus\" (use an IANA name such as Europe/Paris)"
        );
    }

    #[test]
    fn six_and_seven_fields_are_refused() {
        assert_eq!(
            invalid_cron_reason("0 0 9 * * MON"),
            "found 6 fields; use 5 fields: minute hour day-of-month month day-of-week \
             (seconds and years are not supported)"
        );
        assert_eq!(
            invalid_cron_reason("0 0 9 * * MON 2027"),
            "found 7 fields; use 5 fields: minute hour day-of-month month day-of-week \
             (seconds and years are not supported)"
        );
        assert_eq!(
            invalid_cron_reason("0 9 * *"),
            "found 4 fields; use 5 fields: minute hour day-of-month month day-of-week \
             (seconds and years are not supported)"
        );
        assert_eq!(
            invalid_cron_reason("daily"),
            "found 1 field; use 5 fields: minute hour day-of-month month day-of-week \
             (seconds and years are not supported)"
        );
        assert_eq!(
            Recurrence::parse("0 0 9 * * MON", "UTC")
                .unwrap_err()
                .to_string(),
            "invalid cron expression \"0 0 9 * * MON\": found 6 fields; use 5 fields: minute hour \
             day-of-month month day-of-week (seconds and years are not supported)"
        );
    }

    #[test]
    fn invalid_expressions_are_refused() {
        assert_eq!(
            invalid_cron_reason(""),
            "it is empty; use 5 fields: minute hour day-of-month month day-of-week, for example \"0 9 * * 1\""
        );
        let cases = [
            (
                "0 9 * * 8",
                "8 is out of range for the day-of-week field; use 0-7 (0 and 7 are Sunday) or SUN-SAT",
            ),
            (
                "0 9 * * FUNDAY",
                "\"FUNDAY\" is not valid in the day-of-week field; use 0-7 (0 and 7 are Sunday) or SUN-SAT",
            ),
            (
                "0 9 * * FRI-MON",
                "the day-of-week range \"FRI-MON\" runs backwards; split it into two ranges",
            ),
            (
                "0 9 * * */0",
                "the step in the day-of-week field \"*/0\" must be a whole number of at least 1",
            ),
            (
                "*/x * * * *",
                "the step in the minute field \"*/x\" must be a whole number of at least 1",
            ),
            (
                "0 9 * * ,",
                "the day-of-week field \",\" has an empty list item",
            ),
            (
                "0 9 1,,2 * *",
                "the day-of-month field \"1,,2\" has an empty list item",
            ),
            (
                "60 * * * *",
                "60 is out of range for the minute field; use 0-59",
            ),
            (
                "0 24 * * *",
                "24 is out of range for the hour field; use 0-23",
            ),
            (
                "0 0 32 * *",
                "32 is out of range for the day-of-month field; use 1-31",
            ),
            (
                "0 0 0 * *",
                "0 is out of range for the day-of-month field; use 1-31",
            ),
            (
                "0 0 * 13 *",
                "13 is out of range for the month field; use 1-12 or JAN-DEC",
            ),
            (
                "0 0 * 0 *",
                "0 is out of range for the month field; use 1-12 or JAN-DEC",
            ),
            (
                "0 0 * FOO *",
                "\"FOO\" is not valid in the month field; use 1-12 or JAN-DEC",
            ),
            (
                "x * * * *",
                "the minute field takes numbers (0-59), not \"x\"",
            ),
            (
                "0 MON * * *",
                "the hour field takes numbers (0-23), not \"MON\"",
            ),
            (
                "1-2-3 * * * *",
                "the minute field takes numbers (0-59), not \"2-3\"",
            ),
            (
                "30-10 * * * *",
                "the minute range \"30-10\" runs backwards; split it into two ranges",
            ),
            (
                "0 9 ? * 1",
                "the day-of-month field \"?\" contains '?'; use numbers, names, *, ranges (a-b), lists (a,b) \
                 and steps (*/n)",
            ),
            (
                "0 9 L * *",
                "the day-of-month field takes numbers (1-31), not \"L\"",
            ),
            (
                "@reboot",
                "@reboot is not a schedule; use 5 fields: minute hour day-of-month month day-of-week",
            ),
            (
                "@often",
                "unknown macro @often; use @yearly, @annually, @monthly, @weekly, @daily, @midnight or @hourly, \
                 or use 5 fields: minute hour day-of-month month day-of-week",
            ),
        ];
        for (cron, reason) in cases {
            assert_eq!(invalid_cron_reason(cron), reason, "{cron}");
        }
        assert_eq!(
            Recurrence::parse("0 24 * * *", "UTC")
                .unwrap_err()
                .to_string(),
            "invalid cron expression \"0 24 * * *\": 24 is out of range for the hour field; use 0-23"
        );
    }

    #[test]
    fn steps_from_a_value_run_to_the_end_of_the_range() {
        assert_eq!(
            upcoming(&rec("5/20 * * * *", "UTC"), "2026-01-01T10:00:00Z", 4),
            times(&[
                "2026-01-01T10:05:00Z",
                "2026-01-01T10:25:00Z",
                "2026-01-01T10:45:00Z",
                "2026-01-01T11:05:00Z",
            ])
        );
        // A step longer than the range keeps only its start.
        assert_eq!(
            upcoming(&rec("*/60 */24 * * *", "UTC"), "2026-01-01T10:00:00Z", 2),
            times(&["2026-01-02T00:00:00Z", "2026-01-03T00:00:00Z"])
        );
        assert_eq!(
            upcoming(&rec("0 22-23,0-1 * * *", "UTC"), "2026-01-01T10:00:00Z", 4),
            times(&[
                "2026-01-01T22:00:00Z",
                "2026-01-01T23:00:00Z",
                "2026-01-02T00:00:00Z",
                "2026-01-02T01:00:00Z",
            ])
        );
        assert_eq!(
            upcoming(
                &rec("0 0 1 january,September *", "UTC"),
                "2026-01-01T10:00:00Z",
                2
            ),
            times(&["2026-09-01T00:00:00Z", "2027-01-01T00:00:00Z"])
        );
    }

    #[test]
    fn daily_nine_am_across_the_spring_change_in_paris() {
        // Clocks go from 02:00 CET to 03:00 CEST on 2026-03-29.
        assert_eq!(
            upcoming(&rec("0 9 * * *", "Europe/Paris"), "2026-03-27T12:00:00Z", 4),
            times(&[
                "2026-03-28T08:00:00Z",
                "2026-03-29T07:00:00Z",
                "2026-03-30T07:00:00Z",
                "2026-03-31T07:00:00Z",
            ])
        );
    }

    #[test]
    fn daily_nine_am_across_the_autumn_change_in_paris() {
        // Clocks go from 03:00 CEST back to 02:00 CET on 2026-10-25.
        assert_eq!(
            upcoming(&rec("0 9 * * *", "Europe/Paris"), "2026-10-23T12:00:00Z", 4),
            times(&[
                "2026-10-24T07:00:00Z",
                "2026-10-25T08:00:00Z",
                "2026-10-26T08:00:00Z",
                "2026-10-27T08:00:00Z",
            ])
        );
    }

    #[test]
    fn times_in_the_spring_gap_are_shifted_forward() {
        let night = rec("30 2 * * *", "Europe/Paris");
        let expected = times(&[
            "2026-03-28T01:30:00Z", // 02:30 CET
            "2026-03-29T01:30:00Z", // 02:30 does not exist: 03:30 CEST
            "2026-03-30T00:30:00Z", // 02:30 CEST
        ]);
        assert_eq!(upcoming(&night, "2026-03-27T12:00:00Z", 3), expected);
        // Also found from inside the gap and just after it.
        assert_eq!(
            night.next_after(t("2026-03-29T01:00:00Z")),
            Some(t("2026-03-29T01:30:00Z"))
        );
        assert_eq!(
            night.next_after(t("2026-03-29T01:10:00Z")),
            Some(t("2026-03-29T01:30:00Z"))
        );
        assert_eq!(
            night.next_after(t("2026-03-29T01:30:00Z")),
            Some(t("2026-03-30T00:30:00Z"))
        );
        // Hourly expressions go on without a double firing.
        assert_eq!(
            upcoming(
                &rec("*/30 * * * *", "Europe/Paris"),
                "2026-03-29T00:00:00Z",
                4
            ),
            times(&[
                "2026-03-29T00:30:00Z", // 01:30 CET
                "2026-03-29T01:00:00Z", // 03:00 CEST
                "2026-03-29T01:30:00Z",
                "2026-03-29T02:00:00Z",
            ])
        );
    }

    #[test]
    fn repeated_times_in_autumn_fire_once_unless_the_expression_is_hourly() {
        let night = rec("30 2 * * *", "Europe/Paris");
        assert_eq!(
            upcoming(&night, "2026-10-24T12:00:00Z", 3),
            times(&[
                "2026-10-25T00:30:00Z", // 02:30 CEST, first pass only
                "2026-10-26T01:30:00Z", // 02:30 CET
                "2026-10-27T01:30:00Z",
            ])
        );
        // From inside the second pass: the next day.
        assert_eq!(
            night.next_after(t("2026-10-25T01:00:00Z")),
            Some(t("2026-10-26T01:30:00Z"))
        );
        // An hourly expression fires in both passes, in order.
        assert_eq!(
            upcoming(
                &rec("*/30 * * * *", "Europe/Paris"),
                "2026-10-24T23:45:00Z",
                6
            ),
            times(&[
                "2026-10-25T00:00:00Z", // 02:00 CEST
                "2026-10-25T00:30:00Z", // 02:30 CEST
                "2026-10-25T01:00:00Z", // 02:00 CET
                "2026-10-25T01:30:00Z", // 02:30 CET
                "2026-10-25T02:00:00Z", // 03:00 CET
                "2026-10-25T02:30:00Z",
            ])
        );
        let hourly = rec("*/30 * * * *", "Europe/Paris");
        assert_eq!(
            hourly.next_after(t("2026-10-25T00:55:00Z")),
            Some(t("2026-10-25T01:00:00Z"))
        );
        assert_eq!(
            hourly.next_after(t("2026-10-25T01:00:00Z")),
            Some(t("2026-10-25T01:30:00Z"))
        );
    }

    #[test]
    fn first_due_is_the_first_occurrence_after_now() {
        let r = rec("0 9 * * 1", "Europe/Paris");
        assert_eq!(
            first_due(&r, t("2026-11-23T07:00:00Z")),
            Some(t("2026-11-23T08:00:00Z"))
        );
        assert_eq!(
            first_due(&r, t("2026-11-23T08:00:00Z")),
            Some(t("2026-11-30T08:00:00Z"))
        );
        assert_eq!(first_due(&rec("0 0 30 2 *", "UTC"), now()), None);
    }

    // ---- plan ----

    fn grace() -> Duration {
        Duration::minutes(1)
    }

    fn firing(due: &str, occurrences: u32) -> PlannedFiring {
        PlannedFiring {
            due: t(due),
            occurrences,
        }
    }

    #[test]
    fn one_shot_fires_once_and_finishes() {
        for missed in [MissedPolicy::Once, MissedPolicy::All, MissedPolicy::Skip] {
            for now in ["2026-11-23T10:00:00Z", "2026-11-23T12:00:00Z"] {
                assert_eq!(
                    plan(t("2026-11-23T10:00:00Z"), None, missed, t(now), grace()),
                    Plan {
                        fire: vec![firing("2026-11-23T10:00:00Z", 1)],
                        next_due: None,
                    },
                    "{missed:?} at {now}"
                );
            }
        }
    }

    #[test]
    fn nothing_fires_before_the_due_time() {
        let r = rec("*/10 * * * *", "UTC");
        for recurrence in [None, Some(&r)] {
            assert_eq!(
                plan(
                    t("2026-11-23T10:00:00Z"),
                    recurrence,
                    MissedPolicy::Once,
                    t("2026-11-23T09:59:59Z"),
                    grace()
                ),
                Plan {
                    fire: vec![],
                    next_due: Some(t("2026-11-23T10:00:00Z")),
                }
            );
        }
    }

    #[test]
    fn recurring_on_time_fires_once_and_moves_on() {
        let r = rec("*/10 * * * *", "UTC");
        for missed in [MissedPolicy::Once, MissedPolicy::All, MissedPolicy::Skip] {
            for now in [
                "2026-11-23T10:00:00Z",
                "2026-11-23T10:00:30Z",
                "2026-11-23T10:01:00Z",
            ] {
                assert_eq!(
                    plan(t("2026-11-23T10:00:00Z"), Some(&r), missed, t(now), grace()),
                    Plan {
                        fire: vec![firing("2026-11-23T10:00:00Z", 1)],
                        next_due: Some(t("2026-11-23T10:10:00Z")),
                    },
                    "{missed:?} at {now}"
                );
            }
        }
    }

    #[test]
    fn a_single_late_occurrence_depends_on_the_policy() {
        let r = rec("*/10 * * * *", "UTC");
        let due = t("2026-11-23T10:00:00Z");
        let now = t("2026-11-23T10:05:00Z");
        let next = Some(t("2026-11-23T10:10:00Z"));
        assert_eq!(
            plan(due, Some(&r), MissedPolicy::Once, now, grace()),
            Plan {
                fire: vec![firing("2026-11-23T10:00:00Z", 1)],
                next_due: next
            }
        );
        assert_eq!(
            plan(due, Some(&r), MissedPolicy::All, now, grace()),
            Plan {
                fire: vec![firing("2026-11-23T10:00:00Z", 1)],
                next_due: next
            }
        );
        assert_eq!(
            plan(due, Some(&r), MissedPolicy::Skip, now, grace()),
            Plan {
                fire: vec![],
                next_due: next
            }
        );
    }

    #[test]
    fn missed_occurrences_once() {
        let r = rec("*/10 * * * *", "UTC");
        assert_eq!(
            plan(
                t("2026-11-23T10:00:00Z"),
                Some(&r),
                MissedPolicy::Once,
                t("2026-11-23T10:35:00Z"),
                grace()
            ),
            Plan {
                fire: vec![firing("2026-11-23T10:30:00Z", 4)],
                next_due: Some(t("2026-11-23T10:40:00Z")),
            }
        );
    }

    #[test]
    fn missed_occurrences_all() {
        let r = rec("*/10 * * * *", "UTC");
        assert_eq!(
            plan(
                t("2026-11-23T10:00:00Z"),
                Some(&r),
                MissedPolicy::All,
                t("2026-11-23T10:35:00Z"),
                grace()
            ),
            Plan {
                fire: vec![
                    firing("2026-11-23T10:00:00Z", 1),
                    firing("2026-11-23T10:10:00Z", 1),
                    firing("2026-11-23T10:20:00Z", 1),
                    firing("2026-11-23T10:30:00Z", 1),
                ],
                next_due: Some(t("2026-11-23T10:40:00Z")),
            }
        );
    }

    #[test]
    fn missed_occurrences_skip() {
        let r = rec("*/10 * * * *", "UTC");
        let due = t("2026-11-23T10:00:00Z");
        assert_eq!(
            plan(
                due,
                Some(&r),
                MissedPolicy::Skip,
                t("2026-11-23T10:35:00Z"),
                grace()
            ),
            Plan {
                fire: vec![],
                next_due: Some(t("2026-11-23T10:40:00Z")),
            }
        );
        // The latest occurrence is still recent: it fires alone.
        assert_eq!(
            plan(
                due,
                Some(&r),
                MissedPolicy::Skip,
                t("2026-11-23T10:30:45Z"),
                grace()
            ),
            Plan {
                fire: vec![firing("2026-11-23T10:30:00Z", 1)],
                next_due: Some(t("2026-11-23T10:40:00Z")),
            }
        );
    }

    #[test]
    fn an_occurrence_exactly_at_now_counts_and_the_next_is_after_now() {
        let r = rec("*/10 * * * *", "UTC");
        assert_eq!(
            plan(
                t("2026-11-23T10:00:00Z"),
                Some(&r),
                MissedPolicy::Once,
                t("2026-11-23T10:30:00Z"),
                grace()
            ),
            Plan {
                fire: vec![firing("2026-11-23T10:30:00Z", 4)],
                next_due: Some(t("2026-11-23T10:40:00Z")),
            }
        );
    }

    #[test]
    fn many_missed_occurrences_are_capped() {
        let r = rec("* * * * *", "UTC");
        let due = t("2026-01-01T00:00:00Z");
        // 1500 occurrences: 00:00 .. 24:59.
        let now = t("2026-01-02T00:59:30Z");
        let all = plan(due, Some(&r), MissedPolicy::All, now, grace());
        assert_eq!(all.fire.len(), 1000);
        assert_eq!(all.fire[0], firing("2026-01-01T00:00:00Z", 1));
        assert_eq!(all.fire[998], firing("2026-01-01T16:38:00Z", 1));
        assert_eq!(all.fire[999], firing("2026-01-02T00:59:00Z", 501));
        assert_eq!(all.fire.iter().map(|f| f.occurrences).sum::<u32>(), 1500);
        assert_eq!(all.next_due, Some(t("2026-01-02T01:00:00Z")));
        let once = plan(due, Some(&r), MissedPolicy::Once, now, grace());
        assert_eq!(once.fire, vec![firing("2026-01-02T00:59:00Z", 1500)]);
        // More than 10 000: counting stops there; the next due time is still after now.
        let far = t("2026-01-15T00:00:30Z");
        let once = plan(due, Some(&r), MissedPolicy::Once, far, grace());
        assert_eq!(once.fire, vec![firing("2026-01-07T22:39:00Z", 10_000)]);
        assert_eq!(once.next_due, Some(t("2026-01-15T00:01:00Z")));
    }

    /// Runs a reminder on a simulated clock ticking every `step` from
    /// `start` to `end`, returning everything it fired.
    fn simulate(
        recurrence: &Recurrence,
        missed: MissedPolicy,
        start: &str,
        end: &str,
        step: Duration,
    ) -> Vec<PlannedFiring> {
        let mut fired = Vec::new();
        let mut now = t(start);
        let mut due = first_due(recurrence, now);
        while now < t(end) {
            now += step;
            if let Some(at) = due
                && now >= at
            {
                let plan = plan(at, Some(recurrence), missed, now, grace());
                fired.extend(plan.fire);
                due = plan.next_due;
                assert!(
                    due.is_none_or(|next| next > now),
                    "next due {due:?} is not after {now}"
                );
            }
        }
        fired
    }

    #[test]
    fn a_simulated_clock_fires_each_occurrence_exactly_once() {
        for missed in [MissedPolicy::Once, MissedPolicy::All, MissedPolicy::Skip] {
            let fired = simulate(
                &rec("*/10 * * * *", "UTC"),
                missed,
                "2026-11-23T09:55:00Z",
                "2026-11-23T10:45:00Z",
                Duration::seconds(7),
            );
            assert_eq!(
                fired,
                vec![
                    firing("2026-11-23T10:00:00Z", 1),
                    firing("2026-11-23T10:10:00Z", 1),
                    firing("2026-11-23T10:20:00Z", 1),
                    firing("2026-11-23T10:30:00Z", 1),
                    firing("2026-11-23T10:40:00Z", 1),
                ],
                "{missed:?}"
            );
        }
    }

    #[test]
    fn a_simulated_clock_across_both_changes_of_time_in_paris() {
        let expected_autumn = vec![
            firing("2026-10-25T00:00:00Z", 1), // 02:00 CEST
            firing("2026-10-25T00:30:00Z", 1), // 02:30 CEST
            firing("2026-10-25T01:00:00Z", 1), // 02:00 CET
            firing("2026-10-25T01:30:00Z", 1), // 02:30 CET
            firing("2026-10-25T02:00:00Z", 1), // 03:00 CET
        ];
        let hourly = rec("*/30 * * * *", "Europe/Paris");
        assert_eq!(
            simulate(
                &hourly,
                MissedPolicy::All,
                "2026-10-24T23:50:00Z",
                "2026-10-25T02:10:00Z",
                Duration::minutes(1)
            ),
            expected_autumn
        );
        let nightly = rec("30 2 * * *", "Europe/Paris");
        assert_eq!(
            simulate(
                &nightly,
                MissedPolicy::All,
                "2026-03-27T00:00:00Z",
                "2026-03-31T00:00:00Z",
                Duration::minutes(1)
            ),
            vec![
                firing("2026-03-27T01:30:00Z", 1),
                firing("2026-03-28T01:30:00Z", 1),
                firing("2026-03-29T01:30:00Z", 1), // shifted to 03:30 CEST
                firing("2026-03-30T00:30:00Z", 1),
            ]
        );
        assert_eq!(
            simulate(
                &nightly,
                MissedPolicy::All,
                "2026-10-23T00:00:00Z",
                "2026-10-27T00:00:00Z",
                Duration::minutes(1)
            ),
            vec![
                firing("2026-10-23T00:30:00Z", 1),
                firing("2026-10-24T00:30:00Z", 1),
                firing("2026-10-25T00:30:00Z", 1), // once, though 02:30 happens twice
                firing("2026-10-26T01:30:00Z", 1),
            ]
        );
    }

    #[test]
    fn a_simulated_clock_that_stops_for_a_while_applies_the_policy_once() {
        // The clock jumps from 10:01 to 10:35 (the scheduler was down).
        let r = rec("*/10 * * * *", "UTC");
        let mut fired = Vec::new();
        let mut due = first_due(&r, t("2026-11-23T09:55:00Z"));
        for now in [
            "2026-11-23T10:00:10Z",
            "2026-11-23T10:35:00Z",
            "2026-11-23T10:40:05Z",
        ] {
            let now = t(now);
            if let Some(at) = due
                && now >= at
            {
                let p = plan(at, Some(&r), MissedPolicy::Once, now, grace());
                fired.extend(p.fire);
                due = p.next_due;
            }
        }
        assert_eq!(
            fired,
            vec![
                firing("2026-11-23T10:00:00Z", 1),
                firing("2026-11-23T10:30:00Z", 3),
                firing("2026-11-23T10:40:00Z", 1),
            ]
        );
        assert_eq!(due, Some(t("2026-11-23T10:50:00Z")));
    }
}
