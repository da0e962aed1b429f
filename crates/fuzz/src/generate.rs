//! Random inputs from the contracts: a wire-valid encoding of a method's
//! input message, built by walking its descriptor field by field (every
//! scalar type with its edge values, enums known and unknown, nested
//! messages to a bounded depth, repeated fields, oneofs, unknown fields),
//! and now and then raw mutations of one (bit flips, truncation) to reach
//! the decoders.
//!
//! Strings are chosen by what the field is (its name): ids from the ids
//! this run has seen and ids that do not exist, paths, times, cron
//! expressions, URLs, JSON. Fields that reach a process or a file write
//! are restricted to harmless values (see [`crate::dict`] and
//! [`tool_arguments`]).

use crate::dict::{self, IdKind, Pools};
use crate::rng::Rng;
use crate::schema::{Field, Kind, MessageType, Schema};
use crate::wire;

/// Nested messages deeper than this are left empty.
const MAX_DEPTH: usize = 6;
/// Long (up to 64 KiB) strings or byte fields one input may hold.
const LONG_VALUES_PER_INPUT: u32 = 2;
/// Percent of inputs that are raw mutations of a generated one.
const MUTATED_PERCENT: u64 = 6;

/// Paths of this run that inputs may name: the project the tool runner
/// may open, and the canary directory outside it no write may reach.
#[derive(Debug, Clone, Default)]
pub struct Places {
    /// The project directory (absolute).
    pub project: String,
    /// Absolute paths inside the project.
    pub inside: Vec<String>,
    /// Paths that lead out of the project into the canary directory.
    pub outside: Vec<String>,
}

/// What generation draws on.
pub struct Source<'a> {
    pub schema: &'a Schema,
    pub pools: &'a Pools,
    pub places: &'a Places,
}

/// State while generating one input.
struct Ctx {
    depth: usize,
    long_left: u32,
    /// The tool the message named so far (its `tool` field precedes its
    /// arguments), for choosing arguments that are safe for it.
    tool: Option<String>,
}

/// One input for a message of type `message`: its encoding, and whether
/// it was mutated after generation (so it may not decode).
pub fn input(src: &Source<'_>, rng: &mut Rng, message: &str) -> (Vec<u8>, bool) {
    let mut bytes = valid(src, rng, message);
    if rng.chance(MUTATED_PERCENT, 100) {
        mutate(rng, &mut bytes);
        return (bytes, true);
    }
    (bytes, false)
}

/// A wire-valid encoding of `message`.
pub fn valid(src: &Source<'_>, rng: &mut Rng, message: &str) -> Vec<u8> {
    let mut ctx = Ctx {
        depth: 0,
        long_left: LONG_VALUES_PER_INPUT,
        tool: None,
    };
    match src.schema.message(message) {
        Some(ty) => encode_message(src, rng, &mut ctx, ty),
        None => Vec::new(),
    }
}

fn encode_message(src: &Source<'_>, rng: &mut Rng, ctx: &mut Ctx, ty: &MessageType) -> Vec<u8> {
    if ctx.depth > MAX_DEPTH {
        return Vec::new();
    }
    ctx.depth += 1;
    // Which member of each oneof is set: usually one, sometimes none,
    // sometimes two (the last one on the wire wins).
    let chosen: Vec<Vec<u32>> = (0..ty.oneofs)
        .map(|i| {
            let members: Vec<u32> = ty
                .fields
                .iter()
                .filter(|f| f.oneof == Some(i))
                .map(|f| f.number)
                .collect();
            let how_many = match rng.below(10) {
                0 | 1 => 0,
                2 => 2,
                _ => 1,
            };
            (0..how_many)
                .filter(|_| !members.is_empty())
                .map(|_| *rng.pick(&members))
                .collect()
        })
        .collect();
    let mut chunks: Vec<Vec<u8>> = Vec::new();
    let saved_tool = ctx.tool.take();
    for field in &ty.fields {
        let present = match field.oneof {
            Some(i) => chosen.get(i).is_some_and(|c| c.contains(&field.number)),
            None => rng.chance(13, 20),
        };
        if !present {
            continue;
        }
        let mut chunk = Vec::new();
        encode_field(src, rng, ctx, ty, field, &mut chunk);
        chunks.push(chunk);
    }
    ctx.tool = saved_tool;
    // The order of fields on the wire does not matter to a decoder.
    if rng.chance(1, 10) && chunks.len() > 1 {
        for i in (1..chunks.len()).rev() {
            chunks.swap(i, rng.index(i + 1));
        }
    }
    let mut out: Vec<u8> = chunks.concat();
    // Unknown fields must be skipped.
    if rng.chance(1, 30) {
        unknown_field(rng, &mut out);
    }
    ctx.depth -= 1;
    out
}

fn unknown_field(rng: &mut Rng, out: &mut Vec<u8>) {
    let number = rng.range(100, 536_870_911) as u32;
    match rng.below(4) {
        0 => {
            wire::key(out, number, wire::VARINT);
            wire::varint(out, rng.next_u64());
        }
        1 => {
            wire::key(out, number, wire::FIXED64);
            out.extend_from_slice(&rng.next_u64().to_le_bytes());
        }
        2 => {
            wire::key(out, number, wire::FIXED32);
            out.extend_from_slice(&(rng.next_u64() as u32).to_le_bytes());
        }
        _ => {
            let bytes: Vec<u8> = (0..rng.range(0, 16)).map(|_| rng.byte()).collect();
            wire::len_field(out, number, &bytes);
        }
    }
}

fn encode_field(
    src: &Source<'_>,
    rng: &mut Rng,
    ctx: &mut Ctx,
    ty: &MessageType,
    field: &Field,
    out: &mut Vec<u8>,
) {
    let count = if field.repeated {
        match rng.below(10) {
            0..=2 => 0,
            3..=7 => rng.range(1, 3),
            8 => rng.range(4, 8),
            _ => rng.range(9, 40),
        }
    } else {
        1
    };
    let packable = !matches!(field.kind, Kind::String | Kind::Bytes | Kind::Message(_));
    if field.repeated && packable && count > 0 && rng.chance(1, 2) {
        // Packed: one length-delimited run of the values.
        let mut packed = Vec::new();
        for _ in 0..count {
            scalar(src, rng, ctx, ty, field, &mut packed);
        }
        wire::len_field(out, field.number, &packed);
        return;
    }
    for _ in 0..count {
        match &field.kind {
            Kind::Message(name) => {
                let inner = match src.schema.message(name) {
                    Some(inner) => encode_message(src, rng, ctx, inner),
                    None => Vec::new(),
                };
                wire::len_field(out, field.number, &inner);
            }
            Kind::String => {
                let text = string(src, rng, ctx, ty, field);
                if field.name == "tool" {
                    ctx.tool = Some(text.clone());
                }
                wire::len_field(out, field.number, text.as_bytes());
            }
            Kind::Bytes => {
                let bytes = bytes_value(rng, ctx);
                wire::len_field(out, field.number, &bytes);
            }
            kind => {
                wire::key(out, field.number, wire::wire_type(kind));
                scalar(src, rng, ctx, ty, field, out);
            }
        }
    }
}

/// A scalar's value, without its key.
fn scalar(
    src: &Source<'_>,
    rng: &mut Rng,
    _ctx: &mut Ctx,
    _ty: &MessageType,
    field: &Field,
    out: &mut Vec<u8>,
) {
    let small = small_number_field(&field.name);
    match &field.kind {
        Kind::Bool => wire::varint(out, *rng.pick(&[0, 1, 1, 0, 1, 2, 255])),
        Kind::Int32 => wire::varint(out, i64::from(int32(rng, small)) as u64),
        Kind::Int64 => wire::varint(out, int64(rng, small) as u64),
        Kind::Uint32 => wire::varint(out, uint(rng, small, true)),
        Kind::Uint64 => wire::varint(out, uint(rng, small, false)),
        Kind::Sint32 => wire::varint(out, wire::zigzag(i64::from(int32(rng, small)))),
        Kind::Sint64 => wire::varint(out, wire::zigzag(int64(rng, small))),
        Kind::Fixed32 => out.extend_from_slice(&(uint(rng, small, true) as u32).to_le_bytes()),
        Kind::Sfixed32 => out.extend_from_slice(&int32(rng, small).to_le_bytes()),
        Kind::Fixed64 => out.extend_from_slice(&uint(rng, small, false).to_le_bytes()),
        Kind::Sfixed64 => out.extend_from_slice(&int64(rng, small).to_le_bytes()),
        Kind::Float => out.extend_from_slice(&(double(rng) as f32).to_le_bytes()),
        Kind::Double => out.extend_from_slice(&double(rng).to_le_bytes()),
        Kind::Enum(name) => {
            let known = src.schema.enum_values(name);
            let value = if !known.is_empty() && rng.chance(4, 5) {
                *rng.pick(known)
            } else {
                *rng.pick(&[-1, 99, 1000, i32::MAX, i32::MIN, known.len() as i32])
            };
            wire::varint(out, i64::from(value) as u64);
        }
        Kind::String | Kind::Bytes | Kind::Message(_) => {}
    }
}

/// Fields whose useful values are small (sequence numbers, counts,
/// timeouts): mostly small numbers, so that they name real events.
fn small_number_field(name: &str) -> bool {
    name.contains("seq")
        || name.contains("epoch")
        || name.contains("limit")
        || name.contains("offset")
        || name.contains("timeout")
        || name.contains("turn")
        || name.contains("ttl")
        || name == "sessions"
}

fn uint(rng: &mut Rng, small: bool, thirty_two: bool) -> u64 {
    if small && rng.chance(3, 4) {
        return rng.below(12);
    }
    let max = if thirty_two {
        u64::from(u32::MAX)
    } else {
        u64::MAX
    };
    match rng.below(10) {
        0..=3 => *rng.pick(&[0, 1, 2, 3, 7, 10, 100, 1000, 65_535, max, max - 1, max / 2 + 1]),
        4..=7 => rng.below(200),
        8 => rng.next_u64() & max,
        // Wider than the field: decoders keep the low bits.
        _ => *rng.pick(&[u64::MAX, 1 << 32, 1 << 63]),
    }
}

fn int32(rng: &mut Rng, small: bool) -> i32 {
    if small && rng.chance(3, 4) {
        return rng.below(12) as i32;
    }
    match rng.below(3) {
        0 => *rng.pick(&[0, 1, -1, 2, i32::MAX, i32::MIN, i32::MAX - 1, i32::MIN + 1, 256]),
        1 => rng.below(200) as i32 - 100,
        _ => rng.next_u64() as i32,
    }
}

fn int64(rng: &mut Rng, small: bool) -> i64 {
    if small && rng.chance(3, 4) {
        return rng.below(12) as i64;
    }
    match rng.below(4) {
        0 => *rng.pick(&[
            0,
            1,
            -1,
            i64::MAX,
            i64::MIN,
            i64::from(i32::MAX) + 1,
            // Timestamps' seconds: the edges of what chrono and RFC 3339 hold.
            253_402_300_799,
            253_402_300_800,
            -62_135_596_800,
            -62_135_596_801,
            8_210_266_876_799,
        ]),
        1 => rng.below(200) as i64 - 100,
        // Around now, so that times are plausible.
        2 => 1_700_000_000 + rng.below(200_000_000) as i64,
        _ => rng.next_u64() as i64,
    }
}

fn double(rng: &mut Rng) -> f64 {
    *rng.pick(&[
        0.0,
        -0.0,
        1.0,
        -1.0,
        0.5,
        1e-300,
        1e300,
        f64::MAX,
        f64::MIN_POSITIVE,
        f64::NAN,
        f64::INFINITY,
        f64::NEG_INFINITY,
        123.456,
    ])
}

fn bytes_value(rng: &mut Rng, ctx: &mut Ctx) -> Vec<u8> {
    const PNG: &[u8] = b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR\0\0\0\x01\0\0\0\x01\x08\x06\0\0\0\x1f\x15\xc4\x89";
    match rng.below(8) {
        0 => Vec::new(),
        1 => PNG.to_vec(),
        2 => b"GIF89a".to_vec(),
        3 if ctx.long_left > 0 => {
            ctx.long_left -= 1;
            vec![0u8; *rng.pick(&[4097, 65_536])]
        }
        _ => (0..rng.range(0, 64)).map(|_| rng.byte()).collect(),
    }
}

/// A string for `field` of `ty`, chosen by what the field holds.
fn string(
    src: &Source<'_>,
    rng: &mut Rng,
    ctx: &mut Ctx,
    ty: &MessageType,
    field: &Field,
) -> String {
    let name = field.name.as_str();
    let short = ty.name.rsplit('.').next().unwrap_or(&ty.name);
    // What reaches a process is never random.
    if name == "command" {
        return rng.pick(dict::COMMANDS).to_string();
    }
    if short == "McpSessionServer" && name == "args" {
        return rng
            .pick(&["", "-v", "--help", "fuzz", "/etc/passwd", "\0"])
            .to_string();
    }
    if name == "tool" && matches!(short, "ExecuteRequest" | "PreviewRequest") {
        return tool_name(rng);
    }
    if name == "arguments_json" && matches!(short, "ExecuteRequest" | "PreviewRequest") {
        return tool_arguments(src, rng, ctx.tool.as_deref().unwrap_or(""));
    }
    // Now and then anything at all, in any field.
    if rng.chance(1, 12) {
        return any_string(src, rng, ctx);
    }
    if let Some(kind) = IdKind::of_field(&ty.name, name) {
        return id(src, rng, kind);
    }
    if short.ends_with("Entry") && name == "key" {
        return rng.pick(dict::NAMES).to_string();
    }
    match name {
        "dir" | "project_dir" | "path" | "file" | "cwd" => path(src, rng),
        "due" => rng.pick(dict::DUE).to_string(),
        "cron" => rng.pick(dict::CRON).to_string(),
        "time_zone" => rng.pick(dict::TIME_ZONES).to_string(),
        "url" | "owner_url" | "advertise_url" => rng.pick(dict::URLS).to_string(),
        "uri" => rng
            .pick(&["file:///README.md", "mcp://srv/x", "res://", "", "http://127.0.0.1:1/r"])
            .to_string(),
        "tool" | "tools" => rng.pick(dict::TOOLS).to_string(),
        "consumer" => rng
            .pick(&["orchestrator", "fuzz", "", "mcp", "a\0b"])
            .to_string(),
        "mime" | "mime_type" => rng
            .pick(&["image/png", "image/svg+xml", "text/plain", "", "a/b/c"])
            .to_string(),
        "text" | "message" | "input" | "content" | "reason" if rng.chance(1, 4) => {
            rng.pick(dict::DIRECTED).to_string()
        }
        _ if name.ends_with("_json") => rng.pick(dict::JSON).to_string(),
        _ => any_string(src, rng, ctx),
    }
}

fn any_string(src: &Source<'_>, rng: &mut Rng, ctx: &mut Ctx) -> String {
    match rng.below(20) {
        0..=9 => rng.pick(dict::GENERAL).to_string(),
        10..=12 => dict::random_chars(rng),
        13 if ctx.long_left > 0 => {
            ctx.long_left -= 1;
            dict::long(rng)
        }
        14 => path(src, rng),
        15 => rng.pick(dict::JSON).to_string(),
        16 => id(src, rng, IdKind::Session),
        17 => rng.pick(dict::DUE).to_string(),
        18 => rng.pick(dict::URLS).to_string(),
        _ => rng.pick(dict::CRON).to_string(),
    }
}

/// An id: one this run has seen (when there is one), one that does not
/// exist, or anything.
fn id(src: &Source<'_>, rng: &mut Rng, kind: IdKind) -> String {
    match rng.below(20) {
        0..=11 => src
            .pools
            .pick(kind, rng)
            .unwrap_or_else(|| rng.pick(dict::MISSING_IDS).to_string()),
        12..=17 => rng.pick(dict::MISSING_IDS).to_string(),
        _ => rng.pick(dict::GENERAL).to_string(),
    }
}

/// A path: the dictionary's, or one of the project's.
fn path(src: &Source<'_>, rng: &mut Rng) -> String {
    let places = src.places;
    match rng.below(10) {
        0..=4 => rng.pick(dict::PATHS).to_string(),
        5 | 6 if !places.project.is_empty() => places.project.clone(),
        7 if !places.inside.is_empty() => rng.pick(&places.inside).clone(),
        8 if !places.outside.is_empty() => rng.pick(&places.outside).clone(),
        _ => format!("{}/{}", places.project, rng.pick(dict::PATHS)),
    }
}

/// Tools that only read.
const READING_TOOLS: &[&str] = &["read_file", "list_dir", "glob", "grep"];
/// Tools that write files.
pub const WRITING_TOOLS: &[&str] = &["write_file", "edit_file"];

/// A tool for `Execute`: mostly the readers, sometimes a writer or bash
/// (with safe arguments), or a name that is not a tool.
fn tool_name(rng: &mut Rng) -> String {
    match rng.below(20) {
        0..=8 => rng.pick(READING_TOOLS).to_string(),
        9..=11 => rng.pick(WRITING_TOOLS).to_string(),
        12 => "bash".to_string(),
        13 => rng.pick(&["web_fetch", "web_search"]).to_string(),
        _ => rng.pick(dict::TOOLS).to_string(),
    }
}

/// Paths a writing tool may be given: inside the workspace, or leading
/// out of the project only as far as the run's canary directory (two
/// levels up from the project; from a scratch workspace, into the
/// cluster's own temporary directory).
pub fn safe_write_paths(places: &Places) -> Vec<String> {
    let mut paths: Vec<String> = [
        "notes.txt",
        "new/dir/file.txt",
        "é 🦀.txt",
        ".hidden",
        "AGENTS.md",
        "escape/secret.txt",
        "../../outside/secret.txt",
        "./././notes.txt",
        "",
        ".",
        "notes.txt/",
    ]
    .iter()
    .map(ToString::to_string)
    .collect();
    paths.extend(places.outside.iter().cloned());
    paths.extend(places.inside.iter().cloned());
    paths
}

/// Arguments for a call of `tool`: anything for the readers (reading
/// `/etc/passwd` is harmless, and must be refused), only
/// [`safe_write_paths`] for the writers, only [`dict::COMMANDS`] for bash,
/// only closed loopback URLs for the web tools.
pub fn tool_arguments(src: &Source<'_>, rng: &mut Rng, tool: &str) -> String {
    use serde_json::json;
    let text = |rng: &mut Rng| -> String {
        match rng.below(4) {
            0 => dict::random_chars(rng),
            1 => dict::long(rng),
            _ => rng.pick(dict::GENERAL).to_string(),
        }
    };
    let number = |rng: &mut Rng| -> serde_json::Value {
        rng.pick(&[
            json!(0),
            json!(1),
            json!(-1),
            json!(1_000_000_000_000u64),
            json!(u64::MAX),
            json!(1.5),
            json!("3"),
            json!(null),
        ])
        .clone()
    };
    let value = if WRITING_TOOLS.contains(&tool) {
        let paths = safe_write_paths(src.places);
        let path = rng.pick(&paths).clone();
        if tool == "write_file" {
            json!({"path": path, "content": text(rng)})
        } else {
            json!({
                "path": path,
                "old_string": rng.pick(&["", "a", "fuzz", "\n"]).to_string(),
                "new_string": text(rng),
                "replace_all": rng.chance(1, 2),
            })
        }
    } else if tool == "bash" {
        let mut args = json!({"command": *rng.pick(dict::COMMANDS)});
        if rng.chance(1, 2) {
            args["timeout_secs"] = number(rng);
        }
        args
    } else if tool.starts_with("web_") {
        json!({"url": *rng.pick(dict::URLS), "query": text(rng)})
    } else if READING_TOOLS.contains(&tool) || rng.chance(1, 2) {
        if rng.chance(1, 5) {
            return rng.pick(dict::JSON).to_string();
        }
        let mut args = json!({"path": path(src, rng)});
        for key in ["pattern", "include", "offset", "limit", "depth", "max_results"] {
            if rng.chance(1, 3) {
                args[key] = if matches!(key, "pattern" | "include") {
                    json!(*rng.pick(&["*", "**/*.rs", "(a+)+$", "[", "fuzz", "", "\\"]))
                } else {
                    number(rng)
                };
            }
        }
        args
    } else {
        return rng.pick(dict::JSON).to_string();
    };
    value.to_string()
}

/// Raw damage to an encoding: bit flips, changed bytes, truncation,
/// deletion, insertion, duplication.
pub fn mutate(rng: &mut Rng, bytes: &mut Vec<u8>) {
    for _ in 0..rng.range(1, 4) {
        let len = bytes.len();
        match rng.below(6) {
            0 if len > 0 => {
                let i = rng.index(len);
                bytes[i] ^= 1 << rng.below(8);
            }
            1 if len > 0 => {
                let i = rng.index(len);
                bytes[i] = rng.byte();
            }
            2 => bytes.truncate(rng.index(len + 1)),
            3 if len > 0 => {
                let at = rng.index(len);
                let end = (at + rng.range(1, 8)).min(len);
                bytes.drain(at..end);
            }
            4 => {
                let at = rng.index(len + 1);
                let extra: Vec<u8> = (0..rng.range(1, 8)).map(|_| rng.byte()).collect();
                bytes.splice(at..at, extra);
            }
            _ if len > 0 => {
                let at = rng.index(len);
                let end = (at + rng.range(1, 16)).min(len);
                let chunk = bytes[at..end].to_vec();
                bytes.splice(at..at, chunk);
            }
            _ => bytes.push(rng.byte()),
        }
    }
}
