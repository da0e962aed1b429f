//! The policy as configured: the `[policy]` section of the configuration,
//! deserialized by the runtime's loader and compiled by
//! [`Policy::from_config`](crate::Policy::from_config).

use serde::Deserialize;
use std::collections::BTreeMap;

/// What a policy does with a tool call.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[serde(rename_all = "lowercase")]
pub enum PolicyDecision {
    /// Run it.
    Allow,
    /// Ask a person first.
    Confirm,
    /// Refuse it; the model is told why.
    Deny,
}

/// The tool-call policy.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct PolicyConfig {
    /// The default decision per tool name.
    #[serde(default)]
    pub tools: BTreeMap<String, PolicyDecision>,
    /// Rules refining the defaults.
    #[serde(default)]
    pub rules: Vec<PolicyRule>,
    /// Give every bash call outbound network, through the tool runner's
    /// proxy (public addresses only, unless the runner names more). Off:
    /// only commands of rules with `network = true` get it.
    #[serde(default)]
    pub network: bool,
}

/// One policy rule.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct PolicyRule {
    /// The tool name, `*` for every tool, or a glob over tool names (e.g.
    /// `time__*` for every tool of the MCP server `time`).
    pub tool: String,
    /// For MCP tools: match only tools whose server says they change
    /// nothing (`true`), or only those it does not say so of (`false`).
    /// The server's word alone never allows a call; a rule that uses it
    /// is the person's decision to trust that server.
    #[serde(default)]
    pub read_only_hint: Option<bool>,
    /// For `bash`: a glob matched against each simple command.
    #[serde(default)]
    pub command: Option<String>,
    /// For file tools: a glob matched against the path argument.
    #[serde(default)]
    pub path: Option<String>,
    /// What to do when it matches.
    pub decision: PolicyDecision,
    /// Why, shown to the person and (on a deny) to the model.
    #[serde(default)]
    pub reason: Option<String>,
    /// For an allow rule of bash: check the arguments of the commands
    /// Agentry knows (`ls`, `cat`, `echo`, `pwd`, read-only `git`
    /// commands) and confirm any option not known to only read, any path
    /// outside the workspace and any computed argument. `false` trusts the
    /// rule as written.
    #[serde(default = "yes")]
    pub check_arguments: bool,
    /// For bash: commands this rule decides get outbound network through
    /// the tool runner's proxy (when every command of the call does).
    #[serde(default)]
    pub network: bool,
    /// For a confirm rule: who may approve the calls it asks about,
    /// `role:approver`, `role:admin` or `user:NAME` (any of them). Empty:
    /// anyone with the approver role.
    #[serde(default)]
    pub approvers: Vec<String>,
    /// For a confirm rule: how many different people must approve (1 to
    /// 5; default 1).
    #[serde(default)]
    pub approvals_required: Option<u32>,
}

fn yes() -> bool {
    true
}
