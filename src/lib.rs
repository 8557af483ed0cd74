//! Ondo's core: everything but the desktop shell. The CLI, the app and the
//! local API are all clients of this library.

pub mod doctor;
pub mod metrics;
pub mod paths;
