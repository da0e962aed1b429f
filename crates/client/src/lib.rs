//! What every Agentry client shares, so that each reaches the services and
//! shows a session the same way: [`connect`], channels to the services with
//! a credential and errors that say what to set; [`view::SessionView`], the one fold of a session's events into a
//! transcript, figures and waiting questions; [`json::event_json`], events
//! as JSON made from the contracts' descriptors; [`relay`], the questions
//! of sub-agents relayed to their parent's client; [`text`], the short
//! forms shown (a call's main argument, money, sizes); and [`terminal`],
//! the one sanitizer between text the client did not write and a
//! terminal.
//!
//! The plain CLI (`agentry run`, the line chat, `sessions show`) and the
//! full-screen chat use it; so do the bench and the tests.

pub mod audit;
pub mod connect;
pub mod json;
pub mod relay;
pub mod terminal;
pub mod text;
pub mod view;

pub use json::event_json;
pub use view::SessionView;
