//! The tools the model is offered, as the log records them: a
//! `ToolsOffered` event whenever the set changes, so the log says which
//! tools each model call had.

use super::ToolFlags;
use crate::tokens::Tokenizer;
use agentry_llm::ToolDefinition;
use agentry_proto::sessions::v1 as pb;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, OnceLock, PoisonError, Weak};

/// The one tool whose calls a turn given network granted it to before the
/// catalog said which tools take network (logs of then record no flag).
const TOOK_NETWORK_BEFORE: &str = "bash";

/// The tools offered to the model, with their flags. Two catalogs are equal
/// when they offer the same tools.
#[derive(Debug, Clone, Default)]
pub struct Catalog {
    /// As offered, in order.
    pub definitions: Vec<ToolDefinition>,
    /// Their flags, by name.
    pub flags: BTreeMap<String, ToolFlags>,
    /// The tokens the definitions take, counted once (an orchestrator has
    /// one tokenizer).
    tokens: OnceLock<usize>,
}

impl PartialEq for Catalog {
    fn eq(&self, other: &Self) -> bool {
        self.definitions == other.definitions && self.flags == other.flags
    }
}

/// The catalogs in use, each with the event that records it, so that
/// sessions offered the same tools share one copy (with its schemas a
/// catalog takes tens of KiB) and replaying a log does not parse the same
/// schemas again for every session. One per orchestrator, in its
/// [`crate::prompt::View`]: the core keeps no global state.
#[derive(Default)]
pub struct Catalogs {
    list: Mutex<Vec<(Weak<Catalog>, pb::ToolsOffered)>>,
}

impl std::fmt::Debug for Catalogs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Catalogs").finish_non_exhaustive()
    }
}

impl Catalogs {
    fn live(&self) -> std::sync::MutexGuard<'_, Vec<(Weak<Catalog>, pb::ToolsOffered)>> {
        let mut list = self.list.lock().unwrap_or_else(PoisonError::into_inner);
        list.retain(|(weak, _)| weak.strong_count() > 0);
        list
    }

    /// The shared copy of `catalog`: an equal one already in use, or this
    /// one (then shared from now on).
    pub fn interned(&self, catalog: Arc<Catalog>) -> Arc<Catalog> {
        let mut list = self.live();
        let existing = list
            .iter()
            .filter_map(|(weak, _)| weak.upgrade())
            .find(|existing| **existing == *catalog);
        if let Some(existing) = existing {
            return existing;
        }
        list.push((Arc::downgrade(&catalog), catalog.to_event()));
        catalog
    }

    /// The shared copy of the catalog an event recorded.
    pub fn shared_from_event(&self, event: &pb::ToolsOffered) -> Arc<Catalog> {
        let existing = self
            .live()
            .iter()
            .find(|(_, recorded)| recorded == event)
            .and_then(|(weak, _)| weak.upgrade());
        match existing {
            Some(existing) => existing,
            None => self.interned(Arc::new(Catalog::from_event(event))),
        }
    }
}

impl Catalog {
    /// The tokens the definitions take in a request.
    pub fn tokens(&self, tokenizer: &Tokenizer) -> usize {
        *self
            .tokens
            .get_or_init(|| tokenizer.definitions(&self.definitions))
    }

    /// Adds a tool (a later tool of the same name replaces the flags, not
    /// the definition: callers add each name once).
    pub fn add(&mut self, definition: ToolDefinition, flags: ToolFlags) {
        self.flags.insert(definition.name.clone(), flags);
        self.definitions.push(definition);
    }

    /// The event that records this catalog.
    pub fn to_event(&self) -> pb::ToolsOffered {
        pb::ToolsOffered {
            tools: self
                .definitions
                .iter()
                .map(|d| {
                    let flags = self.flags.get(&d.name).copied().unwrap_or_default();
                    pb::OfferedTool {
                        name: d.name.clone(),
                        description: d.description.clone(),
                        parameters_json_schema: d.parameters.to_string(),
                        read_only: flags.read_only,
                        parallel_safe: flags.parallel_safe,
                        read_only_hint: flags.read_only_hint,
                        network: Some(flags.network),
                    }
                })
                .collect(),
        }
    }

    /// The catalog an event recorded. A schema that does not parse (the
    /// log was written by this code, so only a damaged log has one) is
    /// offered as an empty object schema.
    pub fn from_event(event: &pb::ToolsOffered) -> Catalog {
        let mut catalog = Catalog::default();
        for tool in &event.tools {
            let parameters = serde_json::from_str(&tool.parameters_json_schema)
                .unwrap_or_else(|_| serde_json::json!({"type": "object"}));
            catalog.add(
                ToolDefinition {
                    name: tool.name.clone(),
                    description: tool.description.clone(),
                    parameters,
                },
                ToolFlags {
                    read_only: tool.read_only,
                    parallel_safe: tool.parallel_safe,
                    read_only_hint: tool.read_only_hint,
                    network: tool.network.unwrap_or(tool.name == TOOK_NETWORK_BEFORE),
                },
            );
        }
        catalog
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_catalog_survives_its_event() {
        let mut catalog = Catalog::default();
        catalog.add(
            ToolDefinition {
                name: "read_file".into(),
                description: "Reads a file.".into(),
                parameters: serde_json::json!({
                    "type": "object",
                    "properties": {"path": {"type": "string"}},
                    "required": ["path"],
                }),
            },
            ToolFlags {
                read_only: true,
                parallel_safe: true,
                read_only_hint: false,
                network: false,
            },
        );
        catalog.add(
            ToolDefinition {
                name: "bash".into(),
                description: "Runs a command.".into(),
                parameters: serde_json::json!({"type": "object"}),
            },
            ToolFlags::default(),
        );
        let event = catalog.to_event();
        assert_eq!(event.tools.len(), 2);
        assert_eq!(event.tools[0].name, "read_file");
        assert!(event.tools[0].read_only && !event.tools[1].read_only);
        assert_eq!(Catalog::from_event(&event), catalog);
    }

    #[test]
    fn equal_catalogs_share_one_copy() {
        let mut catalog = Catalog::default();
        catalog.add(
            ToolDefinition {
                name: "only_in_this_test".into(),
                description: "A tool.".into(),
                parameters: serde_json::json!({"type": "object"}),
            },
            ToolFlags::default(),
        );
        let catalogs = Catalogs::default();
        let first = catalogs.interned(Arc::new(catalog.clone()));
        let again = catalogs.interned(Arc::new(Catalog::from_event(&catalog.to_event())));
        assert!(Arc::ptr_eq(&first, &again));
        assert!(Arc::ptr_eq(
            &first,
            &catalogs.shared_from_event(&catalog.to_event())
        ));
        let mut other = catalog.clone();
        other.flags.insert(
            "only_in_this_test".into(),
            ToolFlags {
                read_only: true,
                parallel_safe: false,
                read_only_hint: false,
                network: false,
            },
        );
        assert!(!Arc::ptr_eq(&first, &catalogs.interned(Arc::new(other))));
    }

    #[test]
    fn a_damaged_schema_becomes_an_empty_object_schema() {
        let event = pb::ToolsOffered {
            tools: vec![pb::OfferedTool {
                name: "x".into(),
                parameters_json_schema: "{not json".into(),
                ..Default::default()
            }],
        };
        let catalog = Catalog::from_event(&event);
        assert_eq!(
            catalog.definitions[0].parameters,
            serde_json::json!({"type": "object"})
        );
    }
}
