//! Ondo's core: everything but the desktop shell. The CLI, the app and the
//! local API are all clients of this library.

pub mod api;
pub mod bench;
pub mod cli;
pub mod demo;
pub mod doctor;
pub mod engine;
pub mod error_kind;
pub mod hub;
pub mod metallib;
pub mod metrics;
pub mod paths;
pub mod report;
pub mod resolve;
pub mod session;
pub mod store;
pub mod synth;
pub mod units;
pub mod whole_file;

pub use error_kind::ErrorKind;
