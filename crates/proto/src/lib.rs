//! Generated code for Agentry's gRPC contracts (`proto/agentry/*/v1`).
//!
//! Nothing but generated code and the encoded file descriptor set lives here;
//! the services translate between these types and their own domain types.
//! It must not depend on any other Agentry crate.
#![allow(clippy::all, clippy::unwrap_used, clippy::expect_used, missing_docs)]

/// Session events and the session store contract.
pub mod sessions {
    /// Version 1.
    pub mod v1 {
        tonic::include_proto!("agentry.sessions.v1");
    }
}

/// The tool runner contract.
pub mod tools {
    /// Version 1.
    pub mod v1 {
        tonic::include_proto!("agentry.tools.v1");
    }
}

/// The scheduler contract.
pub mod scheduler {
    /// Version 1.
    pub mod v1 {
        tonic::include_proto!("agentry.scheduler.v1");
    }
}

/// The orchestrator contract.
pub mod orchestrator {
    /// Version 1.
    pub mod v1 {
        tonic::include_proto!("agentry.orchestrator.v1");
    }
}

/// The encoded `FileDescriptorSet` of every contract, for server reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/agentry_descriptor.bin"));
