//! The popover window: shown on demand from the tray, hidden rather than
//! closed, so the app stays one click away.

use tauri::{AppHandle, Manager, Runtime, Window, WindowEvent};

/// The label of the popover window in tauri.conf.json.
pub const POPOVER_LABEL: &str = "main";

/// The command-line flag that shows the popover at start (for tests and
/// `make app`); otherwise the app starts in the tray only.
pub const SHOW_FLAG: &str = "--show";

/// True when the process arguments (program name first) ask for the popover.
pub fn shown_at_start(args: impl IntoIterator<Item = String>) -> bool {
    args.into_iter().skip(1).any(|arg| arg == SHOW_FLAG)
}

/// Shows and focuses the popover.
pub fn show<R: Runtime>(app: &AppHandle<R>) -> tauri::Result<()> {
    match app.get_webview_window(POPOVER_LABEL) {
        Some(popover) => {
            popover.show()?;
            popover.set_focus()
        }
        None => Ok(()),
    }
}

/// Hides the popover if it is visible, shows it otherwise.
pub fn toggle<R: Runtime>(app: &AppHandle<R>) -> tauri::Result<()> {
    match app.get_webview_window(POPOVER_LABEL) {
        Some(popover) if popover.is_visible()? => popover.hide(),
        Some(_) => show(app),
        None => Ok(()),
    }
}

/// Turns a close into a hide: the app lives in the tray, and reopening a
/// hidden window keeps the UI's state.
pub fn on_window_event<R: Runtime>(window: &Window<R>, event: &WindowEvent) {
    match event {
        WindowEvent::CloseRequested { api, .. } => {
            api.prevent_close();
            hide(window);
        }
        // A menu-bar popover on macOS goes away when the user clicks elsewhere.
        #[cfg(target_os = "macos")]
        WindowEvent::Focused(false) => hide(window),
        _ => {}
    }
}

fn hide<R: Runtime>(window: &Window<R>) {
    if let Err(error) = window.hide() {
        eprintln!("ondo-app: could not hide the window: {error}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(list: &[&str]) -> Vec<String> {
        list.iter().map(|arg| (*arg).to_owned()).collect()
    }

    #[test]
    fn starts_hidden_without_the_flag() {
        assert!(!shown_at_start(args(&["ondo-app"])));
        assert!(!shown_at_start(args(&["ondo-app", "--other"])));
    }

    #[test]
    fn starts_shown_with_the_flag_anywhere_after_the_program() {
        assert!(shown_at_start(args(&["ondo-app", "--show"])));
        assert!(shown_at_start(args(&["ondo-app", "--x", "--show"])));
    }

    #[test]
    fn the_program_name_is_not_an_argument() {
        assert!(!shown_at_start(args(&["--show"])));
    }
}
