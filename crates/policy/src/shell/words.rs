//! Words and their expansions: quoting, globs, parameters, arithmetic, and
//! the command substitutions inside them (walked as commands of their own).

use super::*;
use brush_parser::word::{self, Parameter, ParameterExpr, WordPiece, WordPieceWithSource};

impl Walker {
    /// An arithmetic expression: bash evaluates every variable named in it
    /// as an expression of its own, array subscripts included, so a value
    /// such as `a[$(cmd)]` set earlier runs `cmd`. The policy cannot see
    /// through that: the line is confirmed. Command substitutions in it
    /// are walked too (a deny rule still denies them).
    pub(super) fn arithmetic(&mut self, expr: &str) {
        self.doubt(
            expr,
            "arithmetic evaluates variables' values as code, which the policy cannot see"
                .to_string(),
        );
        if expr.contains(['$', '`']) {
            self.word(expr);
        }
    }

    /// Analyzes one word: its text after quote removal, whether it is
    /// literal, and the commands its substitutions run.
    pub(super) fn word(&mut self, raw: &str) -> ShellWord {
        if self.depth >= MAX_DEPTH {
            self.doubt(raw, "the command nests too deeply to check".to_string());
            return ShellWord {
                text: raw.to_string(),
                literal: false,
            };
        }
        match word::parse(raw, &self.options) {
            Ok(pieces) => {
                let (mut text, mut literal) = (String::new(), true);
                self.depth += 1;
                self.pieces(raw, &pieces, false, &mut text, &mut literal);
                self.depth -= 1;
                ShellWord { text, literal }
            }
            Err(e) => {
                self.doubt(raw, format!("could not parse the word {raw:?}: {e}"));
                ShellWord {
                    text: raw.to_string(),
                    literal: false,
                }
            }
        }
    }

    pub(super) fn pieces(
        &mut self,
        raw: &str,
        pieces: &[WordPieceWithSource],
        quoted: bool,
        text: &mut String,
        literal: &mut bool,
    ) {
        for piece in pieces {
            let source = raw.get(piece.start_index..piece.end_index).unwrap_or("");
            match &piece.piece {
                WordPiece::Text(s) => {
                    text.push_str(s);
                    if !quoted && has_glob(s) {
                        *literal = false;
                    }
                }
                WordPiece::SingleQuotedText(s) => text.push_str(s),
                WordPiece::AnsiCQuotedText(_) => {
                    text.push_str(source);
                    *literal = false;
                }
                WordPiece::DoubleQuotedSequence(inner) => {
                    self.pieces(raw, inner, true, text, literal);
                }
                WordPiece::GettextDoubleQuotedSequence(inner) => {
                    self.pieces(raw, inner, true, text, literal);
                    *literal = false;
                }
                WordPiece::TildeExpansion(_) => text.push_str(source),
                WordPiece::ParameterExpansion(expr) => {
                    text.push_str(source);
                    *literal = false;
                    if !plain_parameter(expr) {
                        self.doubt(
                            source,
                            format!(
                                "the expansion {source} has an operator; bash may evaluate a \
                                 variable's value as code (prompt expansion, indirection, \
                                 arithmetic)"
                            ),
                        );
                    }
                    self.parameter_expr(expr);
                }
                WordPiece::CommandSubstitution(code) => {
                    text.push_str(source);
                    *literal = false;
                    self.source(code);
                }
                WordPiece::BackquotedCommandSubstitution(code) => {
                    text.push_str(source);
                    *literal = false;
                    // The parser undoes `\`` but not `\\` or `\$`, so a
                    // substitution nested two levels down would hide: the
                    // body is read from the source as the shell reads it.
                    match backquoted_body(source, quoted) {
                        Some(body) => self.source(&body),
                        None => self.source(code),
                    }
                }
                WordPiece::EscapeSequence(s) => {
                    let escaped = s.strip_prefix('\\').unwrap_or(s);
                    if escaped == "\n" {
                        // A line continuation.
                    } else if !quoted || matches!(escaped, "$" | "`" | "\"" | "\\") {
                        text.push_str(escaped);
                    } else {
                        text.push_str(s);
                    }
                }
                WordPiece::ArithmeticExpression(expr) => {
                    text.push_str(source);
                    *literal = false;
                    self.arithmetic(&expr.value);
                }
            }
        }
    }

    fn parameter(&mut self, parameter: &Parameter) {
        match parameter {
            Parameter::NamedWithIndex { index, .. } => self.arithmetic(index),
            Parameter::Positional(_)
            | Parameter::Special(_)
            | Parameter::Named(_)
            | Parameter::NamedWithAllIndices { .. } => {}
        }
    }

    /// The words and expressions inside `${...}` (e.g. the default in
    /// `${X:-$(cmd)}`).
    fn parameter_expr(&mut self, expr: &ParameterExpr) {
        match expr {
            ParameterExpr::Parameter { parameter, .. }
            | ParameterExpr::ParameterLength { parameter, .. }
            | ParameterExpr::Transform { parameter, .. } => self.parameter(parameter),
            ParameterExpr::UseDefaultValues {
                parameter,
                default_value: value,
                ..
            }
            | ParameterExpr::AssignDefaultValues {
                parameter,
                default_value: value,
                ..
            }
            | ParameterExpr::IndicateErrorIfNullOrUnset {
                parameter,
                error_message: value,
                ..
            }
            | ParameterExpr::UseAlternativeValue {
                parameter,
                alternative_value: value,
                ..
            }
            | ParameterExpr::RemoveSmallestSuffixPattern {
                parameter,
                pattern: value,
                ..
            }
            | ParameterExpr::RemoveLargestSuffixPattern {
                parameter,
                pattern: value,
                ..
            }
            | ParameterExpr::RemoveSmallestPrefixPattern {
                parameter,
                pattern: value,
                ..
            }
            | ParameterExpr::RemoveLargestPrefixPattern {
                parameter,
                pattern: value,
                ..
            }
            | ParameterExpr::UppercaseFirstChar {
                parameter,
                pattern: value,
                ..
            }
            | ParameterExpr::UppercasePattern {
                parameter,
                pattern: value,
                ..
            }
            | ParameterExpr::LowercaseFirstChar {
                parameter,
                pattern: value,
                ..
            }
            | ParameterExpr::LowercasePattern {
                parameter,
                pattern: value,
                ..
            } => {
                self.parameter(parameter);
                if let Some(value) = value {
                    self.word(value);
                }
            }
            ParameterExpr::Substring {
                parameter,
                offset,
                length,
                ..
            } => {
                self.parameter(parameter);
                self.arithmetic(&offset.value);
                if let Some(length) = length {
                    self.arithmetic(&length.value);
                }
            }
            ParameterExpr::ReplaceSubstring {
                parameter,
                pattern,
                replacement,
                ..
            } => {
                self.parameter(parameter);
                self.word(pattern);
                if let Some(replacement) = replacement {
                    self.word(replacement);
                }
            }
            ParameterExpr::VariableNames { .. } | ParameterExpr::MemberKeys { .. } => {}
        }
    }
}

/// Whether a `${...}` only reads a variable as it is: `$x`, `${x}`, `$1`,
/// `$@`, `${a[@]}`, `${#x}`. Every operator (`${x@P}`, `${!x}`,
/// `${x:-…}`, `${x:1}`, `${a[i]}`…) may evaluate a value as code or as
/// arithmetic, or is simply more than the policy reads.
fn plain_parameter(expr: &ParameterExpr) -> bool {
    let simple = |parameter: &Parameter| {
        matches!(
            parameter,
            Parameter::Positional(_)
                | Parameter::Special(_)
                | Parameter::Named(_)
                | Parameter::NamedWithAllIndices { .. }
        )
    };
    match expr {
        ParameterExpr::Parameter {
            parameter,
            indirect,
        } => !indirect && simple(parameter),
        ParameterExpr::ParameterLength {
            parameter,
            indirect,
        } => !indirect && simple(parameter),
        _ => false,
    }
}

/// The command inside a backquoted substitution (`source` with its
/// backquotes), as the shell runs it: a backslash is dropped before `$`,
/// a backquote or a backslash (and, inside double quotes, before `"`),
/// and kept before anything else.
fn backquoted_body(source: &str, quoted: bool) -> Option<String> {
    let inner = source.strip_prefix('`')?.strip_suffix('`')?;
    let mut body = String::with_capacity(inner.len());
    let mut chars = inner.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\\' {
            match chars.peek() {
                Some('$' | '`' | '\\') => {}
                Some('"') if quoted => {}
                _ => {
                    body.push(c);
                    continue;
                }
            }
            if let Some(next) = chars.next() {
                body.push(next);
            }
            continue;
        }
        body.push(c);
    }
    Some(body)
}
