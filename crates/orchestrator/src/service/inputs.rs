//! What a client sends, checked and completed before it reaches a
//! session: the wire input turned into the reducer's, the `@server:uri` and
//! `@path` mentions read and attached, images checked, a model name checked
//! against the server's list.

use super::*;

impl Sessions {
    /// A user message with the MCP resources it mentions (`@server:uri`,
    /// for configured servers) read and attached. A mention of a server
    /// that is not configured is left as written (it may be an address);
    /// a resource that cannot be read refuses the message, saying why.
    pub async fn with_attachments(&self, session_id: &str, input: Input) -> Result<Input, Status> {
        if let Input::SetModel(name) = &input {
            self.check_model(name).await?;
            return Ok(input);
        }
        let Input::UserMessage {
            turn_id,
            text,
            approval_mode,
            plan,
            network,
            budget,
            mut images,
        } = input
        else {
            return Ok(input);
        };
        let mentions = crate::attachments::mentions(&text);
        if mentions.len() > crate::attachments::MAX_ATTACHMENTS {
            return Err(Status::invalid_argument(format!(
                "the message mentions {} resources; at most {} may be attached to one message",
                mentions.len(),
                crate::attachments::MAX_ATTACHMENTS
            )));
        }
        let mut resources = Vec::new();
        if !mentions.is_empty() {
            let servers: Vec<String> = self
                .deps
                .runners
                .list_tools()
                .await
                .map(|r| r.mcp_servers.into_iter().map(|s| s.name).collect())
                .unwrap_or_default();
            for (server, uri) in mentions {
                if !servers.contains(&server) {
                    continue;
                }
                let request = agentry_proto::tools::v1::McpReadResourceRequest {
                    session_id: session_id.to_string(),
                    server: server.clone(),
                    uri: uri.clone(),
                };
                let read = self
                    .deps
                    .runners
                    .on_any(|mut client| {
                        let request = request.clone();
                        async move {
                            client
                                .mcp_read_resource(request)
                                .await
                                .map(tonic::Response::into_inner)
                        }
                    })
                    .await
                    .map_err(|s| {
                        Status::failed_precondition(format!(
                            "cannot attach @{server}:{uri}: {}",
                            s.message()
                        ))
                    })?;
                let mut content = read.text;
                if read.truncated {
                    content.push_str("\n[cut to the tool runner's output limit]");
                }
                resources.push((server, uri, read.mime_type, content));
            }
        }
        let text = crate::attachments::attach(&text, &resources);
        let (files, mentioned) = self.attached_files(session_id, &text).await?;
        let text = crate::attachments::attach_files(&text, &files);
        images.extend(mentioned);
        check_images(&images)?;
        // The images go where the model reads them from, or nowhere.
        for image in &mut images {
            if image.mime.is_empty() {
                image.mime = agentry_runtime::images::image_type(&image.data)
                    .unwrap_or_default()
                    .to_string();
            }
        }
        if !images.is_empty() && !self.settings.view().images {
            return Err(Status::failed_precondition(format!(
                "the model {:?} is not set to take images, so the message's {} cannot be \
                 sent; if it takes images, set `llm.images = true` in the configuration, \
                 else describe the image in words",
                self.deps.llm().model(),
                if images.len() == 1 { "image" } else { "images" }
            )));
        }
        if text.len() > MAX_MESSAGE_BYTES {
            return Err(Status::invalid_argument(format!(
                "the message with its attachments is {} bytes; at most {MAX_MESSAGE_BYTES} are \
                 accepted",
                text.len()
            )));
        }
        Ok(Input::UserMessage {
            turn_id,
            text,
            approval_mode,
            plan,
            network,
            budget,
            images,
        })
    }
}

impl Sessions {
    /// Refuses a model the model server does not list (when it lists its
    /// models); the configured one (empty) is always fine.
    pub(super) async fn check_model(&self, name: &str) -> Result<(), Status> {
        if name.is_empty() {
            return Ok(());
        }
        let llm = self.deps.llm();
        match llm.listed_models(std::time::Duration::from_secs(5)).await {
            Ok(Some(models))
                if !models.is_empty()
                    && !models
                        .iter()
                        .any(|m| m == name || *m == format!("{name}:latest")) =>
            {
                Err(Status::failed_precondition(format!(
                    "the model server at {} does not list {name:?}; it lists: {}",
                    llm.url(),
                    models
                        .iter()
                        .take(12)
                        .cloned()
                        .collect::<Vec<_>>()
                        .join(", ")
                )))
            }
            // Listed, not listed by this kind of server, or unreachable
            // (the next model call says so): taken as given.
            _ => Ok(()),
        }
    }

    /// The files and listings a message mentions with `@path`, read as the
    /// session by a tool runner's read_file and list_dir: (path, is a
    /// listing, content). A mention that looks like a path and cannot be
    /// read refuses the message with the reason; another word (`@alice`)
    /// is left as written unless such a file exists.
    #[allow(clippy::type_complexity)]
    pub(super) async fn attached_files(
        &self,
        session_id: &str,
        text: &str,
    ) -> Result<(Vec<(String, bool, String)>, Vec<spb::Image>), Status> {
        let mentions = crate::attachments::file_mentions(text);
        if mentions.len() > crate::attachments::MAX_ATTACHMENTS {
            return Err(Status::invalid_argument(format!(
                "the message mentions {} files; at most {} may be attached to one message",
                mentions.len(),
                crate::attachments::MAX_ATTACHMENTS
            )));
        }
        let mut files = Vec::new();
        let mut images = Vec::new();
        for (n, mention) in mentions.into_iter().enumerate() {
            if !mention.dir && crate::attachments::is_image(&mention.path) {
                images.push(self.attached_image(session_id, mention.path).await?);
                continue;
            }
            // A directory named without its `/` is listed too.
            let tools: &[&str] = if mention.dir {
                &["list_dir"]
            } else {
                &["read_file", "list_dir"]
            };
            let mut result = None;
            for tool in tools {
                let request = agentry_proto::tools::v1::ExecuteRequest {
                    call_id: format!("attach-{n}"),
                    session_id: session_id.to_string(),
                    tool: tool.to_string(),
                    arguments_json: serde_json::json!({ "path": mention.path }).to_string(),
                    timeout_ms: 0,
                    network: false,
                    resume: None,
                };
                let read = self
                    .deps
                    .runners
                    .execute(request, true, |_| async { true })
                    .await;
                let done = read.as_ref().is_ok_and(|r| !r.is_error);
                // The first tool's failure is the one to tell.
                if done || result.is_none() {
                    result = Some((*tool == "list_dir", read));
                }
                if done {
                    break;
                }
            }
            let Some((listing, result)) = result else {
                continue;
            };
            match result {
                Ok(read) if !read.is_error => {
                    files.push((mention.path, listing, read.output));
                }
                Ok(_) | Err(_) if !mention.clearly_a_path => {}
                Ok(read) => {
                    return Err(Status::failed_precondition(format!(
                        "cannot attach @{}: {} (to send the word as written, put it in \
                         quotes)",
                        mention.path, read.output
                    )));
                }
                Err(failure) => {
                    return Err(Status::unavailable(format!(
                        "cannot attach @{}: {}",
                        mention.path, failure.message
                    )));
                }
            }
        }
        Ok((files, images))
    }

    /// The image a message mentions with `@path`, read as the session by a
    /// tool runner.
    pub(super) async fn attached_image(
        &self,
        session_id: &str,
        path: String,
    ) -> Result<spb::Image, Status> {
        if !self.settings.view().images {
            return Err(Status::failed_precondition(format!(
                "@{path} is an image, and the model {:?} is not set to take images; if it \
                 takes images, set `llm.images = true` in the configuration, else describe \
                 the image in words",
                self.deps.llm().model()
            )));
        }
        let request = agentry_proto::tools::v1::ReadImageRequest {
            session_id: session_id.to_string(),
            path: path.clone(),
        };
        let read = self
            .deps
            .runners
            .on_any(|mut client| {
                let request = request.clone();
                async move {
                    client
                        .read_image(request)
                        .await
                        .map(tonic::Response::into_inner)
                }
            })
            .await
            .map_err(|s| {
                let why = format!("cannot attach @{path}: {}", s.message());
                match s.code() {
                    tonic::Code::Unavailable => Status::unavailable(why),
                    _ => Status::failed_precondition(why),
                }
            })?;
        Ok(spb::Image {
            path,
            mime: read.mime,
            data: read.data,
        })
    }
}

/// Images a client sent with a message: each of a kind the model servers
/// take (its first bytes tell; the media type given must agree), within
/// the size limits.
fn check_images(images: &[spb::Image]) -> Result<(), Status> {
    use agentry_runtime::images::{MAX_IMAGE_BYTES, MAX_MESSAGE_IMAGE_BYTES, image_type};
    if images.len() > crate::attachments::MAX_ATTACHMENTS {
        return Err(Status::invalid_argument(format!(
            "the message has {} images; at most {} may be sent with one message",
            images.len(),
            crate::attachments::MAX_ATTACHMENTS
        )));
    }
    let mut total = 0u64;
    for (n, image) in images.iter().enumerate() {
        let name = if image.path.is_empty() {
            format!("image {}", n + 1)
        } else {
            image.path.clone()
        };
        if image.data.len() as u64 > MAX_IMAGE_BYTES {
            return Err(Status::invalid_argument(format!(
                "{name} is {} bytes; an image may have at most {MAX_IMAGE_BYTES}",
                image.data.len()
            )));
        }
        match image_type(&image.data) {
            Some(kind) if image.mime.is_empty() || image.mime == kind => {}
            Some(kind) => {
                return Err(Status::invalid_argument(format!(
                    "{name} is said to be {} but is {kind}",
                    image.mime
                )));
            }
            None => {
                return Err(Status::invalid_argument(format!(
                    "{name} is not a PNG, JPEG, GIF or WebP image, the kinds model servers take"
                )));
            }
        }
        total += image.data.len() as u64;
    }
    if total > MAX_MESSAGE_IMAGE_BYTES {
        return Err(Status::invalid_argument(format!(
            "the message's images have {total} bytes in all; at most \
             {MAX_MESSAGE_IMAGE_BYTES} may be sent with one message"
        )));
    }
    Ok(())
}

/// The id of a turn an input starts.
pub fn new_turn_id() -> String {
    uuid::Uuid::now_v7().to_string()
}

/// Checks an input from a client and turns it into the reducer's input:
/// the one type from the wire to the state machine.
/// Refuses an input its sender's role does not allow: answering an
/// approval request needs `approver`, any other input `operator` (which
/// the method asks already). Inputs made in-process (`by` is `None`) are
/// the orchestrator's own.
pub(super) fn allowed(by: Option<&Principal>, input: Option<&pb::Input>) -> Result<(), Status> {
    let Some(by) = by else { return Ok(()) };
    match input.and_then(|i| i.kind.as_ref()) {
        Some(pb::input::Kind::Approval(_)) => by.require(Role::Approver, "answering an approval"),
        Some(pb::input::Kind::McpAnswer(_)) => {
            by.require(Role::Approver, "answering an MCP server's questions")
        }
        Some(pb::input::Kind::RaiseBudget(_)) => by.require(
            Role::Approver,
            "raising the spending limits of a parked turn",
        ),
        // Approving every call of a turn ahead is answering its approvals.
        Some(pb::input::Kind::UserMessage(m))
            if m.approval_mode == spb::ApprovalMode::Always as i32 =>
        {
            by.require(Role::Approver, "a turn with every call approved")
        }
        _ => by.require(
            Role::Operator,
            "sending a message, a cancel or a model switch",
        ),
    }
}

/// Largest answer to an MCP server's questions accepted.
const MAX_ANSWER_BYTES: usize = 64 * 1024;

/// Reads a submitted input; `by` is who sent it (an approval records who
/// answered, for the rules that name approvers).
pub(super) fn parse_input(
    input: Option<pb::Input>,
    by: Option<&Principal>,
) -> Result<Input, Status> {
    let kind = input.and_then(|i| i.kind).ok_or_else(|| {
        Status::invalid_argument("the input is empty: set user_message, approval or cancel")
    })?;
    match kind {
        pb::input::Kind::UserMessage(m) if m.compact => {
            let text = if m.text.trim().is_empty() {
                "/compact".to_string()
            } else {
                m.text.chars().take(1000).collect()
            };
            Ok(Input::Compact {
                turn_id: new_turn_id(),
                text,
            })
        }
        pb::input::Kind::UserMessage(m) => {
            if m.text.trim().is_empty() {
                return Err(Status::invalid_argument("the message is empty"));
            }
            if m.text.len() > MAX_MESSAGE_BYTES {
                return Err(Status::invalid_argument(format!(
                    "the message is {} bytes; at most {MAX_MESSAGE_BYTES} are accepted",
                    m.text.len()
                )));
            }
            check_images(&m.images)?;
            Ok(Input::UserMessage {
                turn_id: new_turn_id(),
                text: m.text,
                approval_mode: spb::ApprovalMode::try_from(m.approval_mode)
                    .unwrap_or(spb::ApprovalMode::Policy),
                plan: m.plan,
                network: m.network,
                budget: m.budget,
                images: m.images,
            })
        }
        pb::input::Kind::Cancel(c) => Ok(Input::Cancel { reason: c.reason }),
        pb::input::Kind::RaiseBudget(r) => {
            let budget = r.budget.unwrap_or_default();
            let costs = [budget.turn_cost, budget.session_cost];
            if costs.iter().any(|c| !c.is_finite() || *c < 0.0) {
                return Err(Status::invalid_argument(
                    "a cost limit must be a positive number",
                ));
            }
            if budget == spb::Budget::default() {
                return Err(Status::invalid_argument(
                    "say which limit to raise: turn_tokens, session_tokens, turn_cost or session_cost",
                ));
            }
            Ok(Input::RaiseBudget { budget })
        }
        pb::input::Kind::Model(m) => {
            let name = m.name.trim().to_string();
            if name.len() > 200 || name.chars().any(char::is_control) {
                return Err(Status::invalid_argument(
                    "a model name has at most 200 characters and no control characters",
                ));
            }
            Ok(Input::SetModel(name))
        }
        pb::input::Kind::McpAnswer(a) => {
            if a.call_id.is_empty() {
                return Err(Status::invalid_argument("the answer names no call_id"));
            }
            if a.content_json.len() > MAX_ANSWER_BYTES {
                return Err(Status::invalid_argument(format!(
                    "the answers are {} bytes; at most {MAX_ANSWER_BYTES} are accepted",
                    a.content_json.len()
                )));
            }
            Ok(Input::McpAnswer {
                call_id: a.call_id,
                action: a.action.trim().to_lowercase(),
                content_json: a.content_json,
                by: by.map(|p| crate::reducer::Answerer {
                    name: p.name.clone(),
                    role: p.role.name().to_string(),
                }),
            })
        }
        pb::input::Kind::Approval(a) => {
            if a.call_id.is_empty() {
                return Err(Status::invalid_argument("the approval names no call_id"));
            }
            let decision = spb::ApprovalDecision::try_from(a.decision).map_err(|_| {
                Status::invalid_argument(format!("unknown approval decision {}", a.decision))
            })?;
            Ok(Input::Approval {
                call_id: a.call_id,
                decision,
                reason: a.reason,
                edited_arguments_json: a.edited_arguments_json,
                by: by.map(|p| crate::reducer::Answerer {
                    name: p.name.clone(),
                    role: p.role.name().to_string(),
                }),
            })
        }
    }
}
