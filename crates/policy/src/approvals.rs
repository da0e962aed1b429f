//! Who may approve a confirmed call: a rule's `approvers` (roles and
//! people) and `approvals_required` (how many different people).

use std::fmt;

/// The roles of people, least first, as the runtime's credential check
/// names them. `service` (a service acting for nobody) ranks above them all.
pub const ROLES: [&str; 5] = ["viewer", "operator", "approver", "admin", "service"];

/// The most approvals a rule may ask for.
pub const MAX_APPROVALS: u32 = 5;

/// One entry of a rule's `approvers`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Approver {
    /// `role:NAME`: anyone with this role or a higher one.
    Role(String),
    /// `user:NAME`: this person.
    Person(String),
}

impl Approver {
    /// Reads `role:approver`, `role:admin` or `user:NAME`.
    pub fn parse(text: &str) -> Result<Approver, String> {
        let text = text.trim();
        if let Some(role) = text.strip_prefix("role:") {
            return match role {
                "approver" | "admin" => Ok(Approver::Role(role.to_string())),
                "viewer" | "operator" => Err(format!(
                    "{text:?}: a {role} cannot answer approvals; name role:approver or role:admin"
                )),
                _ => Err(format!(
                    "{text:?}: unknown role; name role:approver or role:admin"
                )),
            };
        }
        if let Some(name) = text.strip_prefix("user:") {
            return if is_person_name(name) {
                Ok(Approver::Person(name.to_string()))
            } else {
                Err(format!(
                    "{text:?}: a person's name has 1 to 64 lower-case letters, digits, '.', '_' \
                     or '-' and starts with a letter"
                ))
            };
        }
        Err(format!(
            "{text:?}: an approver is \"role:approver\", \"role:admin\" or \"user:NAME\""
        ))
    }

    /// Whether the person `name` with `role` is this approver.
    pub fn admits(&self, name: &str, role: &str) -> bool {
        match self {
            Approver::Person(person) => person == name,
            Approver::Role(least) => rank(role) >= rank(least),
        }
    }
}

impl fmt::Display for Approver {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Approver::Role(role) => write!(f, "role:{role}"),
            Approver::Person(name) => write!(f, "user:{name}"),
        }
    }
}

/// Where `role` stands among [`ROLES`]; below them all when unknown.
fn rank(role: &str) -> Option<usize> {
    ROLES.iter().position(|r| *r == role)
}

/// Whether `name` is a person's name as the people file allows it.
fn is_person_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name.starts_with(|c: char| c.is_ascii_lowercase())
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"._-".contains(&b))
}

/// Who must approve a confirmed call before it runs. The default asks
/// one person with the approver role.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Need {
    /// Each list is one rule's `approvers`: an approving person must be in
    /// every list. Empty: any approver.
    pub approvers: Vec<Vec<Approver>>,
    /// How many different people must approve (0 and 1 both mean one).
    pub required: u32,
}

impl Default for Need {
    fn default() -> Need {
        Need {
            approvers: Vec::new(),
            required: 1,
        }
    }
}

impl Need {
    /// More than "one person with the approver role": a standing approval
    /// for the session does not answer such a call, nor does a turn run
    /// with every call approved.
    pub fn is_restricted(&self) -> bool {
        !self.approvers.is_empty() || self.required > 1
    }

    /// How many approvals it takes.
    pub fn count(&self) -> u32 {
        self.required.max(1)
    }

    /// Whether `name` with `role` may approve.
    pub fn admits(&self, name: &str, role: &str) -> bool {
        self.approvers
            .iter()
            .all(|any| any.iter().any(|a| a.admits(name, role)))
    }

    /// Adds what another rule asks: its people, and the larger count.
    pub fn join(&mut self, other: &Need) {
        for list in &other.approvers {
            if !self.approvers.contains(list) {
                self.approvers.push(list.clone());
            }
        }
        self.required = self.required.max(other.required);
    }

    /// Who may approve, for a person to read: `role:admin or user:alice`,
    /// lists joined by `; and `.
    pub fn describe(&self) -> String {
        let lists: Vec<String> = self
            .approvers
            .iter()
            .map(|any| {
                any.iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join(" or ")
            })
            .collect();
        let who = if lists.is_empty() {
            "anyone with the approver role".to_string()
        } else {
            lists.join("; and ")
        };
        match self.count() {
            1 => who,
            n => format!("{n} different people: {who}"),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn approvers_are_read_and_checked() {
        assert_eq!(
            Approver::parse("role:admin"),
            Ok(Approver::Role("admin".into()))
        );
        assert_eq!(
            Approver::parse(" user:alice "),
            Ok(Approver::Person("alice".into()))
        );
        for (bad, says) in [
            ("role:viewer", "cannot answer approvals"),
            ("role:boss", "unknown role"),
            ("user:Alice", "lower-case"),
            ("user:", "lower-case"),
            ("alice", "role:approver"),
        ] {
            let err = Approver::parse(bad).unwrap_err();
            assert!(err.contains(says), "{bad}: {err}");
        }
    }

    #[test]
    fn a_role_admits_it_and_above_a_person_only_them() {
        let admin = Approver::Role("admin".into());
        assert!(admin.admits("x", "admin"));
        assert!(admin.admits("x", "service"));
        assert!(!admin.admits("x", "approver"));
        assert!(!admin.admits("x", "nonsense"));
        let approver = Approver::Role("approver".into());
        assert!(approver.admits("x", "admin"));
        assert!(!approver.admits("x", "operator"));
        let alice = Approver::Person("alice".into());
        assert!(alice.admits("alice", "approver"));
        assert!(!alice.admits("bob", "admin"));
    }

    #[test]
    fn a_need_joins_lists_and_keeps_the_larger_count() {
        let mut need = Need {
            approvers: vec![vec![Approver::Role("admin".into())]],
            required: 1,
        };
        need.join(&Need {
            approvers: vec![vec![Approver::Person("alice".into())]],
            required: 2,
        });
        assert_eq!(need.count(), 2);
        // In every list: alice only when she is an admin.
        assert!(need.admits("alice", "admin"));
        assert!(!need.admits("alice", "approver"));
        assert!(!need.admits("bob", "admin"));
        assert_eq!(
            need.describe(),
            "2 different people: role:admin; and user:alice"
        );
        assert!(Need::default().admits("anyone", "approver"));
        assert!(!Need::default().is_restricted());
    }
}
