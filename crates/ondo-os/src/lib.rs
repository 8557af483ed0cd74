//! OS probes.
