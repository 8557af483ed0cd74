//! Ondo's core: everything but the desktop shell.
