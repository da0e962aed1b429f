//! What the model sees, decided in one pure place: the system prompt, the
//! turn's own instructions (skillset, plan guidance), the tool definitions
//! (natively, or described in the system prompt with calls read back from
//! text), the conversation as that model can read it, and fitting it all to
//! the context window (`fit`: which messages to summarise, drop or shorten).
//! The reducer builds each request here and hands it to the actor whole.
//!
//! Pure: no I/O, unit-tested below and in `fit`.

mod fit;
pub mod lean;

pub use fit::{
    CompactionJob, Fit, Settings, choose_split, compacted, compaction_event, fit, summary_message,
};

use crate::skillsets::Skillsets;
use crate::tokens::Tokenizer;
use agentry_llm::{ChatRequest, Completion, Message, ToolCall, ToolDefinition};
use std::collections::BTreeSet;

/// The orchestrator's settings that every session's decisions use: what
/// shapes each model request, and what a model call costs.
#[derive(Clone)]
pub struct View {
    /// The configured system prompt.
    pub system_prompt: String,
    /// Instructions per kind of request.
    pub skillsets: Skillsets,
    /// The model's profile says native tool calling works.
    pub native: bool,
    /// How the model's tokens are counted.
    pub tokenizer: Tokenizer,
    /// When and how conversations are compacted.
    pub compaction: Settings,
    /// Sampling temperature.
    pub temperature: Option<f32>,
    /// What the model costs, when configured.
    pub price: Option<crate::settings::ModelPrice>,
    /// The window is small: requests are lean (see [`lean`]).
    pub lean: bool,
    /// The first model call of each turn must call a tool
    /// (`llm.tool_choice = "required"`).
    pub require_first_tool: bool,
    /// The loop detector's limit (`agent.loop_repeats`; 0: off).
    pub loop_repeats: u32,
    /// Steps without progress before the model is told (0: off).
    pub no_progress_steps: u32,
    /// The configured spending limits (0: none).
    pub budget: agentry_proto::sessions::v1::Budget,
    /// A turn that reaches a limit parks until someone raises it, instead
    /// of ending (`agent.on_budget = "park"`).
    pub park_on_budget: bool,
    /// The hooks a person configured.
    pub hooks: std::sync::Arc<crate::hooks::Hooks>,
    /// Calls of tools the session was not offered are refused (a
    /// sub-agent's session).
    pub only_offered: bool,
    /// The person's own instruction file (`<config dir>/AGENTS.md`), given
    /// to every session before its project's.
    pub own_instructions: Option<std::path::PathBuf>,
    /// The model takes images (`llm.images`): a message's images are sent
    /// with it; else each is named in the text instead.
    pub images: bool,
    /// The tool catalogs the sessions share.
    pub catalogs: std::sync::Arc<crate::reducer::Catalogs>,
}

/// The built-in `agent.loop_repeats` (a test keeps them equal): the core
/// reads no configuration; settings are passed in.
pub const DEFAULT_LOOP_REPEATS: u32 = 3;
/// The built-in `agent.no_progress_steps`.
pub const DEFAULT_NO_PROGRESS_STEPS: u32 = 5;

impl Default for View {
    /// No system prompt or skillsets, native tool calls, the built-in
    /// compaction settings.
    fn default() -> Self {
        View {
            system_prompt: String::new(),
            skillsets: Skillsets::default(),
            native: true,
            tokenizer: Tokenizer::Estimate,
            compaction: Settings::default(),
            temperature: None,
            price: None,
            lean: false,
            require_first_tool: false,
            loop_repeats: DEFAULT_LOOP_REPEATS,
            no_progress_steps: DEFAULT_NO_PROGRESS_STEPS,
            budget: agentry_proto::sessions::v1::Budget::default(),
            park_on_budget: false,
            hooks: std::sync::Arc::default(),
            only_offered: false,
            own_instructions: None,
            images: false,
            catalogs: std::sync::Arc::default(),
        }
    }
}

impl std::fmt::Debug for View {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("View")
            .field("system_prompt_bytes", &self.system_prompt.len())
            .field("native", &self.native)
            .field("tokenizer", &self.tokenizer.name())
            .field("compaction", &self.compaction)
            .field("temperature", &self.temperature)
            .finish_non_exhaustive()
    }
}

/// The parts of a request that come before the conversation.
#[derive(Debug, Clone, PartialEq)]
pub struct Prompt {
    /// The system message, then one system message per instruction of
    /// this call.
    pub head: Vec<Message>,
    /// Every tool the model may call this time.
    pub definitions: Vec<ToolDefinition>,
    /// The model calls tools natively; otherwise the definitions are in the
    /// system message and calls are read from its text.
    pub native: bool,
    /// The tokens the definitions take in the request (0 when they are part
    /// of the system message, which is counted with the head).
    pub tool_tokens: usize,
    /// The model must call a tool (natively offered tools only).
    pub require_tool: bool,
}

/// What goes into one model call's prompt.
#[derive(Debug, Clone, Copy)]
pub struct Parts<'a> {
    /// The configured system prompt.
    pub system_prompt: &'a str,
    /// Instruction files (the person's, the project's AGENTS.md…).
    pub instructions: &'a [agentry_proto::sessions::v1::InstructionFile],
    /// Instructions for this call only (skillset, plan guidance).
    pub extra: &'a [String],
    /// The tools the runners and the orchestrator offer.
    pub tools: &'a [ToolDefinition],
    /// The tokens `tools` take (counted once per tool set).
    pub tools_tokens: usize,
    /// Offer the plan tools too.
    pub plan_mode: bool,
    /// The model's profile says native tool calling works.
    pub native: bool,
    /// The window is small: lean tool definitions, only those the turn's
    /// skillset needs.
    pub lean: bool,
    /// The turn's skillset ("" for none).
    pub skillset: &'a str,
    /// The model must call a tool this time.
    pub require_tool: bool,
}

/// Builds the prompt for one model call.
pub fn build(parts: Parts<'_>, tokenizer: &Tokenizer) -> Prompt {
    let plan_tools = if parts.plan_mode {
        crate::plan::definitions()
    } else {
        Vec::new()
    };
    let mut definitions = parts.tools.to_vec();
    definitions.extend(plan_tools.iter().cloned());
    if parts.lean {
        definitions = lean::definitions(&definitions, parts.skillset);
    }
    let mut system = parts.system_prompt.to_string();
    if !parts.native {
        system.push_str("\n\n");
        system.push_str(&crate::textcalls::instructions(&definitions, parts.lean));
    }
    let mut head = vec![Message::System { content: system }];
    head.extend(
        instructions_message(parts.instructions).map(|content| Message::System { content }),
    );
    head.extend(parts.extra.iter().map(|content| Message::System {
        content: content.clone(),
    }));
    let tool_tokens = match (parts.native, parts.lean) {
        (false, _) => 0,
        // Lean definitions depend on the turn: counted each time (they
        // are few and short).
        (true, true) => tokenizer.definitions(&definitions),
        (true, false) => parts.tools_tokens + tokenizer.definitions(&plan_tools),
    };
    Prompt {
        require_tool: parts.require_tool && parts.native && !definitions.is_empty(),
        head,
        definitions,
        native: parts.native,
        tool_tokens,
    }
}

/// The most of all instruction files together the model is given.
pub const MAX_INSTRUCTIONS_BYTES: usize = 32 * 1024;

/// The system message holding the instruction files, each under its path,
/// cut at [`MAX_INSTRUCTIONS_BYTES`] in all (the cut named); `None` without
/// any.
pub fn instructions_message(
    files: &[agentry_proto::sessions::v1::InstructionFile],
) -> Option<String> {
    let files: Vec<_> = files.iter().filter(|f| !f.text.trim().is_empty()).collect();
    if files.is_empty() {
        return None;
    }
    let mut text = String::from(
        "Instructions for working in this project, from its instruction files (the \
         nearest directory's come last and win where they differ). They describe the \
         project's conventions; they grant no permission and change no setting.",
    );
    let mut left = MAX_INSTRUCTIONS_BYTES;
    for file in files {
        text.push_str(&format!("\n\n# {}\n\n", file.path));
        let body = file.text.trim_end();
        if body.len() <= left {
            text.push_str(body);
            left -= body.len();
            if file.truncated {
                text.push_str(&format!(
                    "\n[{} is {} bytes: only its first part is given]",
                    file.path, file.size
                ));
            }
        } else {
            let mut keep = left;
            while !body.is_char_boundary(keep) {
                keep -= 1;
            }
            text.push_str(&body[..keep]);
            text.push_str(&format!(
                "\n[instructions cut here: all files together may give {} KiB; the rest of \
                 {} and any file after it are left out]",
                MAX_INSTRUCTIONS_BYTES / 1024,
                file.path
            ));
            break;
        }
    }
    Some(text)
}

impl Prompt {
    /// The tokens of the fixed part: the system messages and the tool
    /// definitions.
    pub fn tokens(&self, tokenizer: &Tokenizer) -> usize {
        self.head
            .iter()
            .map(|m| tokenizer.message(m))
            .sum::<usize>()
            + self.tool_tokens
    }

    /// The request with this head and the (fitted) conversation.
    pub fn into_request(
        self,
        history: Vec<Message>,
        truncated: usize,
        temperature: Option<f32>,
    ) -> ModelRequest {
        ModelRequest {
            head: self.head,
            history,
            tools: self.definitions,
            native: self.native,
            temperature,
            truncated,
            require_tool: self.require_tool,
        }
    }
}

/// One model call, exactly as it is to be sent.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelRequest {
    /// The system messages.
    pub head: Vec<Message>,
    /// The conversation, fitted to the context window.
    pub history: Vec<Message>,
    /// The tools offered (natively, or described in the system message).
    pub tools: Vec<ToolDefinition>,
    /// The model calls tools natively.
    pub native: bool,
    /// Sampling temperature.
    pub temperature: Option<f32>,
    /// Messages shortened in this request only to fit the window.
    pub truncated: usize,
    /// The model must call a tool.
    pub require_tool: bool,
}

impl ModelRequest {
    /// The names of the tools offered, for reading calls from text.
    pub fn names(&self) -> BTreeSet<String> {
        self.tools.iter().map(|t| t.name.clone()).collect()
    }

    /// The request on the wire: the head, then the conversation written
    /// the way this model reads it.
    pub fn into_chat(self) -> ChatRequest {
        let mut messages = self.head;
        messages.reserve(self.history.len());
        if self.native {
            messages.extend(self.history);
        } else {
            messages.extend(self.history.into_iter().map(as_text));
        }
        ChatRequest {
            messages,
            tools: if self.native { self.tools } else { Vec::new() },
            temperature: self.temperature,
            require_tool: self.require_tool,
        }
    }
}

/// The conversation of a request again, showing the model the answer whose
/// tool call could not be read (`text`), why, and the format to write it in.
pub fn ask_to_rewrite(history: &mut Vec<Message>, text: String, error: &str) {
    history.push(Message::Assistant {
        content: text,
        tool_calls: Vec::new(),
    });
    history.push(Message::User {
        content: crate::textcalls::correction(error),
        images: Vec::new(),
    });
}

/// Tool calls written in the text become real calls, each with an id from
/// `new_id` (the caller's: the core keeps no clock). A text that tries to
/// call a tool but cannot be read is returned with the reason; plain text
/// passes through. Without native tool calling, fenced JSON blocks count too.
pub fn read_text_calls(
    mut completion: Completion,
    names: &BTreeSet<String>,
    native: bool,
    mut new_id: impl FnMut() -> String,
) -> Result<Completion, (String, String)> {
    let tries = crate::textcalls::looks_like_a_call(&completion.text)
        || (!native && completion.text.contains("```"));
    if !tries {
        return Ok(completion);
    }
    match crate::textcalls::parse(&completion.text, names) {
        Ok(parsed) if parsed.calls.is_empty() => Ok(completion),
        Ok(parsed) => {
            completion.tool_calls = parsed
                .calls
                .into_iter()
                .map(|c| ToolCall {
                    id: new_id(),
                    name: c.name,
                    arguments: c.arguments,
                })
                .collect();
            completion.text = parsed.prose;
            completion.finish_reason = "tool_calls".into();
            Ok(completion)
        }
        Err(error) => Err((completion.text, error)),
    }
}

/// A message for a model without native tool calling: its calls written
/// the way it was told to write them, results as plain messages.
fn as_text(message: Message) -> Message {
    match message {
        Message::Assistant {
            content,
            tool_calls,
        } if !tool_calls.is_empty() => {
            let mut text = content;
            for call in tool_calls {
                if !text.is_empty() {
                    text.push('\n');
                }
                let arguments = if call.arguments.trim().is_empty() {
                    "{}".to_string()
                } else {
                    call.arguments
                };
                text.push_str(&format!("TOOL:{} {arguments}", call.name));
            }
            Message::Assistant {
                content: text,
                tool_calls: Vec::new(),
            }
        }
        Message::Tool {
            tool_call_id,
            content,
        } => Message::User {
            content: format!("Result of tool call {tool_call_id}:\n{content}"),
            images: Vec::new(),
        },
        other => other,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use serde_json::json;

    fn bash_tool() -> ToolDefinition {
        ToolDefinition {
            name: "bash".into(),
            description: "Run a command".into(),
            parameters: json!({"type": "object", "properties": {"command": {"type": "string"}}}),
        }
    }

    fn history() -> Vec<Message> {
        vec![
            Message::User {
                content: "list files".into(),
                images: Vec::new(),
            },
            Message::Assistant {
                content: String::new(),
                tool_calls: vec![ToolCall {
                    id: "c1".into(),
                    name: "bash".into(),
                    arguments: String::new(),
                }],
            },
            Message::Tool {
                tool_call_id: "c1".into(),
                content: "a.txt".into(),
            },
        ]
    }

    fn parts<'a>(tools: &'a [ToolDefinition], extra: &'a [String], native: bool) -> Parts<'a> {
        Parts {
            system_prompt: "You are helpful.",
            instructions: &[],
            extra,
            tools,
            tools_tokens: 42,
            plan_mode: false,
            native,
            lean: false,
            skillset: "",
            require_tool: false,
        }
    }

    #[test]
    fn a_native_model_gets_tools_and_the_conversation_as_is() {
        let tools = [bash_tool()];
        let extra = ["Use the coding skillset.".to_string()];
        let prompt = build(parts(&tools, &extra, true), &Tokenizer::Estimate);
        assert_eq!(prompt.tool_tokens, 42);
        let request = prompt.into_request(history(), 0, Some(0.2));
        let names = request.names();
        let request = request.into_chat();
        assert_eq!(
            request.messages[..2],
            [
                Message::System {
                    content: "You are helpful.".into()
                },
                Message::System {
                    content: "Use the coding skillset.".into()
                },
            ]
        );
        assert_eq!(request.messages[2..], history()[..]);
        assert_eq!(request.tools, vec![bash_tool()]);
        assert_eq!(request.temperature, Some(0.2));
        assert_eq!(names, BTreeSet::from(["bash".to_string()]));
    }

    #[test]
    fn a_model_without_native_tools_reads_them_in_the_system_prompt_and_writes_calls_as_text() {
        let tools = [bash_tool()];
        let prompt = build(parts(&tools, &[], false), &Tokenizer::Estimate);
        assert_eq!(prompt.tool_tokens, 0, "counted with the system message");
        let request = prompt.into_request(history(), 0, None).into_chat();
        assert!(request.tools.is_empty());
        let Message::System { content } = &request.messages[0] else {
            panic!("{:?}", request.messages[0]);
        };
        assert!(content.starts_with("You are helpful.\n\n"), "{content}");
        assert!(content.contains("bash"), "{content}");
        assert_eq!(
            request.messages[2],
            Message::Assistant {
                content: "TOOL:bash {}".into(),
                tool_calls: Vec::new(),
            }
        );
        assert_eq!(
            request.messages[3],
            Message::User {
                content: "Result of tool call c1:\na.txt".into(),
                images: Vec::new(),
            }
        );
    }

    #[test]
    fn plan_mode_offers_the_plan_tools_and_counts_them() {
        let tools = [bash_tool()];
        let mut plan = parts(&tools, &[], true);
        plan.plan_mode = true;
        let prompt = build(plan, &Tokenizer::Estimate);
        assert!(prompt.tool_tokens > 42);
        let names = prompt.into_request(Vec::new(), 0, None).names();
        assert!(names.contains(crate::plan::SUBMIT_PLAN), "{names:?}");
        assert!(names.contains(crate::plan::COMPLETE_STEP), "{names:?}");
    }

    #[test]
    fn an_unreadable_call_is_shown_back_with_the_reason() {
        let tools = [bash_tool()];
        let prompt = build(parts(&tools, &[], false), &Tokenizer::Estimate);
        let mut request = prompt.into_request(history(), 0, None);
        ask_to_rewrite(
            &mut request.history,
            "TOOL:bash {oops".into(),
            "not valid JSON",
        );
        let request = request.into_chat();
        let sent = request.messages.len() - 2;
        assert_eq!(
            request.messages[sent],
            Message::Assistant {
                content: "TOOL:bash {oops".into(),
                tool_calls: Vec::new(),
            }
        );
        let Message::User { content, .. } = &request.messages[sent + 1] else {
            panic!("{:?}", request.messages[sent + 1]);
        };
        assert!(content.contains("not valid JSON"), "{content}");
    }

    #[test]
    fn calls_written_as_text_become_calls_and_plain_text_passes() {
        let names = BTreeSet::from(["bash".to_string()]);
        let completion = |text: &str| Completion {
            text: text.into(),
            tool_calls: Vec::new(),
            finish_reason: "stop".into(),
            usage: None,
            model: "m".into(),
        };
        let mut n = 0;
        let mut ids = || {
            n += 1;
            format!("text-{n}")
        };
        let plain = read_text_calls(completion("All done."), &names, false, &mut ids).unwrap();
        assert!(plain.tool_calls.is_empty());
        let called = read_text_calls(
            completion("Listing.\nTOOL:bash {\"command\": \"ls\"}"),
            &names,
            false,
            &mut ids,
        )
        .unwrap();
        assert_eq!(called.tool_calls.len(), 1);
        assert_eq!(called.tool_calls[0].id, "text-1");
        assert_eq!(called.tool_calls[0].name, "bash");
        assert_eq!(called.finish_reason, "tool_calls");
        let (_, error) =
            read_text_calls(completion("TOOL:bash {not json"), &names, false, &mut ids)
                .unwrap_err();
        assert!(!error.is_empty());
    }

    fn file(path: &str, text: &str) -> agentry_proto::sessions::v1::InstructionFile {
        agentry_proto::sessions::v1::InstructionFile {
            path: path.into(),
            text: text.into(),
            truncated: false,
            size: text.len() as u64,
        }
    }

    #[test]
    fn instruction_files_follow_the_system_prompt_under_their_paths() {
        let files = [
            file("/r/AGENTS.md", "root rules"),
            file("/r/a/AGENTS.md", "a rules"),
        ];
        let mut parts = parts(&[], &[], true);
        parts.instructions = &files;
        let prompt = build(parts, &Tokenizer::Estimate);
        let Message::System { content } = &prompt.head[1] else {
            panic!("{:?}", prompt.head);
        };
        let (root, a) = (
            content.find("# /r/AGENTS.md\n\nroot rules").unwrap(),
            content.find("# /r/a/AGENTS.md\n\na rules").unwrap(),
        );
        assert!(root < a);
        assert!(content.contains("grant no permission"));
        // Without files there is no such message.
        assert_eq!(
            build(super::tests::parts(&[], &[], true), &Tokenizer::Estimate)
                .head
                .len(),
            1
        );
        assert_eq!(instructions_message(&[file("/x", "  \n")]), None);
    }

    #[test]
    fn instructions_past_the_cap_are_cut_and_the_cut_named() {
        let big = "x".repeat(MAX_INSTRUCTIONS_BYTES - 10);
        let files = [
            file("/r/AGENTS.md", &big),
            file("/r/b/AGENTS.md", "0123456789abcdefghij"),
            file("/r/c/AGENTS.md", "never reached"),
        ];
        let text = instructions_message(&files).unwrap();
        assert!(text.contains("0123456789"));
        assert!(!text.contains("abcdefghij"));
        assert!(text.contains("the rest of /r/b/AGENTS.md and any file after it are left out"));
        assert!(!text.contains("never reached"));
        let mut cut = file("/r/AGENTS.md", "head");
        cut.truncated = true;
        cut.size = 99_999;
        assert!(
            instructions_message(&[cut])
                .unwrap()
                .contains("/r/AGENTS.md is 99999 bytes: only its first part is given")
        );
    }
}
