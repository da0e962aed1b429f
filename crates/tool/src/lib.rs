//! One abstraction for every tool the agent can call.
//!
//! A [`Tool`] has a [`ToolSpec`] (what the model is told, and the flags the
//! policy reads) and runs with a call context. The context is the host's:
//! the tool runner gives its tools the session's workspace, a deadline and
//! an output sink; the orchestrator gives its built-ins the session and the
//! turn. A [`Registry`] holds a host's tools by name, and [`Toolbox`]es
//! whose tools come and go (an MCP server's). Dispatch is a lookup, never a
//! match on names.

pub mod breaker;
pub mod output;

/// Defines a failure told as a sentence (to a person, or to the model):
/// its own type, so a function says which kind it can fail with, and
/// nothing decides by its text. Needs `thiserror` where it is used.
#[macro_export]
macro_rules! sentence_error {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
        #[error("{0}")]
        pub struct $name(pub String);

        impl From<String> for $name {
            fn from(text: String) -> Self {
                $name(text)
            }
        }

        impl From<&str> for $name {
            fn from(text: &str) -> Self {
                $name(text.to_string())
            }
        }

        impl From<$name> for String {
            fn from(error: $name) -> String {
                error.0
            }
        }
    };
}

use serde::Deserialize;
use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

/// A running call: a future the host drives (and drops to cancel it).
pub type Running<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// What a host gives its tools' calls, and what a call ends with.
pub trait Context: Send + Sync {
    /// What a finished call gives back.
    type Output: Send;
}

/// A tool: its description, and its run with a call context.
pub trait Tool<C: Context>: Send + Sync {
    /// What the model is told about it, and its flags.
    fn spec(&self) -> &ToolSpec;

    /// Runs one call with these JSON arguments; dropping the future
    /// cancels it.
    fn run<'a>(&'a self, call: &'a C, arguments: &'a str) -> Running<'a, C::Output>;

    /// The workspace path a call acts on, for tools that name one.
    fn target(&self, _arguments: &str) -> Option<Target> {
        None
    }
}

/// The path a call acts on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// As the call gave it.
    pub path: String,
    /// It names a directory (a listing or a search), not a file.
    pub directory: bool,
}

/// Tools that come and go while the host runs (an MCP server's).
pub trait Toolbox<C: Context>: Send + Sync {
    /// The tools offered now.
    fn tools(&self) -> Vec<Arc<dyn Tool<C>>>;

    /// The tool of this name, if it is offered now.
    fn find(&self, name: &str) -> Option<Arc<dyn Tool<C>>>;
}

/// Where a tool comes from.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Source {
    /// The host's own.
    #[default]
    Own,
    /// An MCP server's, with what the server says of it (a claim, never
    /// trusted for the policy).
    Mcp {
        /// The server's name.
        server: String,
        /// The server says it changes nothing.
        read_only_hint: bool,
    },
}

/// A tool's description and flags.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolSpec {
    /// Its name, unique in a registry.
    pub name: String,
    /// What it does, for the model.
    pub description: String,
    /// JSON Schema of its arguments.
    pub schema: serde_json::Value,
    /// It changes nothing.
    pub read_only: bool,
    /// It may run concurrently with other parallel-safe calls.
    pub parallel_safe: bool,
    /// It is sensitive (asked about under the default policy).
    pub sensitive: bool,
    /// A call may be given network access.
    pub network: bool,
    /// Its calls run processes in the workspace that may grow it (watched
    /// against the workspace's quota).
    pub grows_workspace: bool,
    /// Where it comes from.
    pub source: Source,
}

impl ToolSpec {
    /// A tool that changes things: it runs alone and is sensitive.
    pub fn changing(name: &str, description: &str, schema: serde_json::Value) -> ToolSpec {
        ToolSpec {
            name: name.to_string(),
            description: description.to_string(),
            schema,
            read_only: false,
            parallel_safe: false,
            sensitive: true,
            network: false,
            grows_workspace: false,
            source: Source::Own,
        }
    }

    /// A tool that only reads: it may run beside other readers and is not
    /// sensitive.
    pub fn reading(name: &str, description: &str, schema: serde_json::Value) -> ToolSpec {
        ToolSpec {
            read_only: true,
            parallel_safe: true,
            sensitive: false,
            ..ToolSpec::changing(name, description, schema)
        }
    }

    /// The same tool, whose calls may be given network access.
    pub fn with_network(self) -> ToolSpec {
        ToolSpec {
            network: true,
            ..self
        }
    }

    /// The same tool, whose processes may grow the workspace.
    pub fn growing_workspace(self) -> ToolSpec {
        ToolSpec {
            grows_workspace: true,
            ..self
        }
    }
}

/// What a finished call of a tool runner's tool reports.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ToolOutcome {
    /// The text for the model.
    pub output: String,
    /// The call failed.
    pub is_error: bool,
    /// The process exit code, when a process exited.
    pub exit_code: Option<i32>,
    /// The output was cut.
    pub truncated: bool,
    /// The call hit its deadline.
    pub timed_out: bool,
}

/// Why a tool runner's call could not give an outcome.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ToolError {
    /// No tool of that name.
    #[error("unknown tool {name:?}; available tools: {available}")]
    UnknownTool {
        /// The name asked for.
        name: String,
        /// The names there are, comma-separated.
        available: String,
    },
    /// The arguments do not fit the tool's schema.
    #[error("{0}")]
    InvalidArguments(String),
    /// The request cannot be served (a field the tool does not take).
    #[error("{0}")]
    InvalidRequest(String),
    /// A path leads out of the workspace.
    #[error("path {path:?} is outside the workspace: {reason}")]
    PathOutsideWorkspace {
        /// The path as given.
        path: String,
        /// Why it is outside.
        reason: String,
    },
    /// A file is binary where text is wanted.
    #[error("{0} is a binary file; read_file only returns text")]
    Binary(String),
    /// Something is past a size limit.
    #[error("{0}")]
    TooLarge(String),
    /// The system failed (retryable).
    #[error("{0}")]
    Io(String),
    /// The sandbox's rules refuse it.
    #[error("{0}")]
    NotAllowed(String),
}

impl ToolError {
    /// Whether the same call may succeed if tried again.
    pub fn is_retryable(&self) -> bool {
        match self {
            ToolError::Io(_) => true,
            ToolError::UnknownTool { .. }
            | ToolError::InvalidArguments(_)
            | ToolError::InvalidRequest(_)
            | ToolError::PathOutsideWorkspace { .. }
            | ToolError::Binary(_)
            | ToolError::TooLarge(_)
            | ToolError::NotAllowed(_) => false,
        }
    }
}

/// Parses a tool's JSON arguments (empty means `{}`) with errors that name
/// the tool and say what is wrong.
pub fn arguments<T: for<'de> Deserialize<'de>>(tool: &str, json: &str) -> Result<T, ToolError> {
    let json = if json.trim().is_empty() { "{}" } else { json };
    let value: serde_json::Value = serde_json::from_str(json).map_err(|e| {
        ToolError::InvalidArguments(format!("arguments of {tool} are not valid JSON: {e}"))
    })?;
    if !value.is_object() {
        return Err(ToolError::InvalidArguments(format!(
            "arguments of {tool} must be a JSON object, got {value}"
        )));
    }
    serde_json::from_value(value)
        .map_err(|e| ToolError::InvalidArguments(format!("invalid arguments for {tool}: {e}")))
}

/// Two tools were registered under one name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("a tool named {0:?} is registered twice")]
pub struct NameTaken(pub String);

/// A host's tools by name, and the toolboxes whose tools come and go.
/// Tools are listed in the order they were registered, then the
/// toolboxes' in theirs: the order the model is offered them in.
pub struct Registry<C: Context> {
    order: Vec<Arc<dyn Tool<C>>>,
    named: BTreeMap<String, Arc<dyn Tool<C>>>,
    boxes: Vec<Arc<dyn Toolbox<C>>>,
}

impl<C: Context> Default for Registry<C> {
    fn default() -> Self {
        Registry {
            order: Vec::new(),
            named: BTreeMap::new(),
            boxes: Vec::new(),
        }
    }
}

impl<C: Context> std::fmt::Debug for Registry<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registry")
            .field("tools", &self.named.keys().collect::<Vec<_>>())
            .field("toolboxes", &self.boxes.len())
            .finish()
    }
}

impl<C: Context> Registry<C> {
    /// A registry with no tools.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a tool under its spec's name.
    pub fn register(&mut self, tool: Arc<dyn Tool<C>>) -> Result<(), NameTaken> {
        let name = tool.spec().name.clone();
        if self.named.contains_key(&name) {
            return Err(NameTaken(name));
        }
        self.named.insert(name, tool.clone());
        self.order.push(tool);
        Ok(())
    }

    /// Adds a toolbox; its tools never hide one registered by name.
    pub fn add_toolbox(&mut self, toolbox: Arc<dyn Toolbox<C>>) {
        self.boxes.push(toolbox);
    }

    /// The tool of this name, if there is one now.
    pub fn get(&self, name: &str) -> Option<Arc<dyn Tool<C>>> {
        if let Some(tool) = self.named.get(name) {
            return Some(tool.clone());
        }
        self.boxes.iter().find_map(|b| b.find(name))
    }

    /// Whether a tool of this name is registered (not counting toolboxes).
    pub fn has_own(&self, name: &str) -> bool {
        self.named.contains_key(name)
    }

    /// Every tool offered now: the registered ones in their order, then
    /// each toolbox's.
    pub fn tools(&self) -> Vec<Arc<dyn Tool<C>>> {
        let mut all = self.order.clone();
        for toolbox in &self.boxes {
            all.extend(
                toolbox
                    .tools()
                    .into_iter()
                    .filter(|t| !self.named.contains_key(&t.spec().name)),
            );
        }
        all
    }

    /// The specs of every tool offered now, in [`Registry::tools`]' order.
    pub fn specs(&self) -> Vec<ToolSpec> {
        self.tools().iter().map(|t| t.spec().clone()).collect()
    }

    /// The error for a name no tool has, listing those there are.
    pub fn unknown(&self, name: &str) -> ToolError {
        ToolError::UnknownTool {
            name: name.to_string(),
            available: self
                .tools()
                .iter()
                .map(|t| t.spec().name.clone())
                .collect::<Vec<_>>()
                .join(", "),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::expect_used, clippy::unwrap_used)]
    use super::*;
    use std::sync::Mutex;

    struct Host;
    impl Context for Host {
        type Output = String;
    }

    struct Echo(ToolSpec);
    impl Tool<Host> for Echo {
        fn spec(&self) -> &ToolSpec {
            &self.0
        }
        fn run<'a>(&'a self, _call: &'a Host, arguments: &'a str) -> Running<'a, String> {
            Box::pin(async move { format!("{}:{arguments}", self.0.name) })
        }
    }

    fn echo(name: &str) -> Arc<dyn Tool<Host>> {
        Arc::new(Echo(ToolSpec::reading(
            name,
            "echoes",
            serde_json::json!({}),
        )))
    }

    struct Changing(Mutex<Vec<&'static str>>);
    impl Toolbox<Host> for Changing {
        fn tools(&self) -> Vec<Arc<dyn Tool<Host>>> {
            self.0.lock().unwrap().iter().map(|n| echo(n)).collect()
        }
        fn find(&self, name: &str) -> Option<Arc<dyn Tool<Host>>> {
            self.0
                .lock()
                .unwrap()
                .iter()
                .find(|n| **n == name)
                .map(|n| echo(n))
        }
    }

    fn block_on<T>(future: Running<'_, T>) -> T {
        // The test futures never wait: one poll finishes them.
        let waker = std::task::Waker::noop();
        let mut cx = std::task::Context::from_waker(waker);
        let mut future = future;
        match future.as_mut().poll(&mut cx) {
            std::task::Poll::Ready(value) => value,
            std::task::Poll::Pending => panic!("a test tool waited"),
        }
    }

    #[test]
    fn tools_are_found_by_name_and_listed_in_the_order_they_came() {
        let mut registry = Registry::new();
        registry.register(echo("zeta")).unwrap();
        registry.register(echo("alpha")).unwrap();
        assert_eq!(
            registry.register(echo("alpha")),
            Err(NameTaken("alpha".into()))
        );
        let names: Vec<_> = registry.specs().into_iter().map(|s| s.name).collect();
        assert_eq!(names, ["zeta", "alpha"]);
        let tool = registry.get("zeta").expect("registered");
        assert_eq!(block_on(tool.run(&Host, "{}")), "zeta:{}");
        assert!(registry.get("beta").is_none());
        assert_eq!(
            registry.unknown("beta").to_string(),
            "unknown tool \"beta\"; available tools: zeta, alpha"
        );
    }

    #[test]
    fn a_toolbox_offers_what_it_has_now_and_never_hides_an_own_tool() {
        let toolbox = Arc::new(Changing(Mutex::new(vec!["alpha", "srv__a"])));
        let mut registry = Registry::new();
        registry.register(echo("zeta")).unwrap();
        registry.register(echo("alpha")).unwrap();
        registry.add_toolbox(toolbox.clone());
        let names: Vec<_> = registry.specs().into_iter().map(|s| s.name).collect();
        assert_eq!(names, ["zeta", "alpha", "srv__a"]);
        assert!(registry.get("srv__a").is_some());
        assert!(registry.has_own("alpha") && !registry.has_own("srv__a"));
        toolbox.0.lock().unwrap().clear();
        assert!(registry.get("srv__a").is_none());
        assert_eq!(registry.specs().len(), 2);
    }

    #[test]
    fn arguments_are_checked_with_errors_that_name_the_tool() {
        #[derive(Deserialize, Debug)]
        #[serde(deny_unknown_fields)]
        struct Args {
            #[serde(default)]
            n: u32,
        }
        assert_eq!(arguments::<Args>("t", "  ").unwrap().n, 0);
        assert_eq!(arguments::<Args>("t", r#"{"n": 3}"#).unwrap().n, 3);
        let e = arguments::<Args>("t", "[1]").unwrap_err();
        assert_eq!(
            e.to_string(),
            "arguments of t must be a JSON object, got [1]"
        );
        let e = arguments::<Args>("t", "{").unwrap_err();
        assert!(
            e.to_string()
                .starts_with("arguments of t are not valid JSON")
        );
        let e = arguments::<Args>("t", r#"{"m": 1}"#).unwrap_err();
        assert!(matches!(e, ToolError::InvalidArguments(_)));
        assert!(
            e.to_string()
                .starts_with("invalid arguments for t: unknown field")
        );
    }
}
