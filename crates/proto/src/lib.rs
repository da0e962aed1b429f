//! Generated code for Agentry's gRPC contracts (`proto/agentry/*/v1`).
//!
//! Nothing but generated code, the encoded file descriptor set, and readers
//! that keep older stored forms of a field readable live here; the services
//! translate between these types and their own domain types. It must not
//! depend on any other Agentry crate.
#![allow(clippy::all, clippy::unwrap_used, clippy::expect_used, missing_docs)]

/// Why a call failed, for programs (carried in `google.rpc.ErrorInfo`).
pub mod errors {
    /// Version 1.
    pub mod v1 {
        include!(concat!(env!("OUT_DIR"), "/agentry.errors.v1.rs"));
    }
}

/// Session events and the session store contract.
pub mod sessions {
    /// Version 1.
    pub mod v1 {
        include!(concat!(env!("OUT_DIR"), "/agentry.sessions.v1.rs"));
        include!(concat!(env!("OUT_DIR"), "/event_kinds.rs"));
    }
}

/// The tool runner contract.
pub mod tools {
    /// Version 1.
    pub mod v1 {
        include!(concat!(env!("OUT_DIR"), "/agentry.tools.v1.rs"));
    }
}

/// The scheduler contract.
pub mod scheduler {
    /// Version 1.
    pub mod v1 {
        include!(concat!(env!("OUT_DIR"), "/agentry.scheduler.v1.rs"));
    }
}

/// The orchestrator contract.
pub mod orchestrator {
    /// Version 1.
    pub mod v1 {
        include!(concat!(env!("OUT_DIR"), "/agentry.orchestrator.v1.rs"));
    }
}

impl sessions::v1::ReminderDue {
    /// What the reminder asks for: `kind`, or, in events written before it
    /// was typed, `legacy_kind` ("notify" or "task"). Unspecified when
    /// neither says.
    pub fn reminder_kind(&self) -> sessions::v1::ReminderKind {
        use sessions::v1::ReminderKind;
        match self.kind() {
            ReminderKind::Unspecified => match self.legacy_kind.as_str() {
                "task" => ReminderKind::Task,
                "notify" => ReminderKind::Notify,
                _ => ReminderKind::Unspecified,
            },
            kind => kind,
        }
    }
}

/// The encoded `FileDescriptorSet` of every contract, for server reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/agentry_descriptor.bin"));

#[cfg(test)]
mod tests {
    use super::sessions::v1::{ReminderDue, ReminderKind};
    use prost::Message;

    #[test]
    fn a_reminder_kind_is_read_from_either_form() {
        // As a log written before the kind was typed holds it.
        let old = ReminderDue {
            legacy_kind: "task".into(),
            ..Default::default()
        }
        .encode_to_vec();
        let read = ReminderDue::decode(old.as_slice()).unwrap();
        assert_eq!(read.reminder_kind(), ReminderKind::Task);
        let mut new = ReminderDue::default();
        new.set_kind(ReminderKind::Notify);
        let read = ReminderDue::decode(new.encode_to_vec().as_slice()).unwrap();
        assert_eq!(read.reminder_kind(), ReminderKind::Notify);
        assert!(read.legacy_kind.is_empty());
        let neither = ReminderDue::default();
        assert_eq!(neither.reminder_kind(), ReminderKind::Unspecified);
    }
}
