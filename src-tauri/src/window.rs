//! The popover window: shown on demand from the tray, placed under the
//! icon, hidden rather than closed, so the app stays one click away.

use std::sync::Mutex;

use tauri::{AppHandle, Manager, PhysicalPosition, Runtime, WebviewWindow, Window, WindowEvent};

/// The label of the popover window in tauri.conf.json.
pub const POPOVER_LABEL: &str = "main";

/// The command-line flag that shows the popover at start (for tests and
/// `make app`); otherwise the app starts in the tray only.
pub const SHOW_FLAG: &str = "--show";

/// The command-line flag that opens the main window at start on a view:
/// `--open runs` or `--open settings`.
pub const OPEN_FLAG: &str = "--open";

/// True when the process arguments (program name first) ask for the popover.
pub fn shown_at_start(args: impl IntoIterator<Item = String>) -> bool {
    args.into_iter().skip(1).any(|arg| arg == SHOW_FLAG)
}

/// The main window's view the process arguments ask for, if any.
pub fn view_at_start(args: impl IntoIterator<Item = String>) -> Option<crate::desktop::AppView> {
    let args: Vec<String> = args.into_iter().skip(1).collect();
    let at = args.iter().position(|arg| arg == OPEN_FLAG)?;
    serde_json::from_value(serde_json::Value::String(args.get(at + 1)?.clone())).ok()
}

/// A rectangle on the screen in physical pixels.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Area {
    pub x: f64,
    pub y: f64,
    pub width: f64,
    pub height: f64,
}

/// Space left between the popover and the screen's edges.
const SCREEN_MARGIN: f64 = 8.0;

/// Where the popover's top-left corner goes: centred under the tray icon
/// (above it when the icon is in the bottom half, as with a taskbar), kept
/// inside the screen's work area. Without an icon position (Linux tray hosts
/// do not report clicks) it goes to the top-right corner, where indicator
/// areas sit.
pub fn popover_origin(icon: Option<Area>, popover: (f64, f64), screen: Area) -> (f64, f64) {
    let (width, height) = popover;
    let (x, y) = match icon {
        Some(icon) => {
            let x = icon.x + icon.width / 2.0 - width / 2.0;
            let below = icon.y + icon.height / 2.0 < screen.y + screen.height / 2.0;
            let y = if below {
                icon.y + icon.height + SCREEN_MARGIN / 2.0
            } else {
                icon.y - height - SCREEN_MARGIN / 2.0
            };
            (x, y)
        }
        None => (
            screen.x + screen.width - width - SCREEN_MARGIN,
            screen.y + SCREEN_MARGIN,
        ),
    };
    let clamp = |value: f64, start: f64, length: f64, size: f64| {
        let last = (start + length - size - SCREEN_MARGIN).max(start);
        value.clamp(start.min(last), last)
    };
    (
        clamp(
            x,
            screen.x + SCREEN_MARGIN,
            screen.width - SCREEN_MARGIN,
            width,
        ),
        clamp(y, screen.y, screen.height, height),
    )
}

/// The tray icon's last known place (macOS reports it with each click).
#[derive(Debug, Default)]
pub struct TrayAnchor(pub Mutex<Option<Area>>);

/// Shows and focuses the popover, placed at the tray icon.
pub fn show<R: Runtime>(app: &AppHandle<R>) -> tauri::Result<()> {
    match app.get_webview_window(POPOVER_LABEL) {
        Some(popover) => {
            if let Err(error) = place(app, &popover) {
                // Shown where it was is better than not shown.
                eprintln!("ondo-app: could not place the popover: {error}");
            }
            popover.show()?;
            popover.set_focus()
        }
        None => Ok(()),
    }
}

fn place<R: Runtime>(app: &AppHandle<R>, popover: &WebviewWindow<R>) -> tauri::Result<()> {
    let icon = app
        .try_state::<TrayAnchor>()
        .and_then(|anchor| *anchor.0.lock().unwrap_or_else(|p| p.into_inner()));
    let monitor = match icon {
        Some(icon) => app.monitor_from_point(icon.x + icon.width / 2.0, icon.y)?,
        None => None,
    };
    let Some(monitor) = monitor.or(app.primary_monitor()?) else {
        return Ok(());
    };
    let work = monitor.work_area();
    let screen = Area {
        x: f64::from(work.position.x),
        y: f64::from(work.position.y),
        width: f64::from(work.size.width),
        height: f64::from(work.size.height),
    };
    let size = popover.outer_size()?;
    let (x, y) = popover_origin(
        icon,
        (f64::from(size.width), f64::from(size.height)),
        screen,
    );
    popover.set_position(PhysicalPosition::new(x.round() as i32, y.round() as i32))
}

/// Hides the popover if it is visible, shows it otherwise.
pub fn toggle<R: Runtime>(app: &AppHandle<R>) -> tauri::Result<()> {
    match app.get_webview_window(POPOVER_LABEL) {
        Some(popover) if popover.is_visible()? => popover.hide(),
        Some(_) => show(app),
        None => Ok(()),
    }
}

/// Turns the popover's close into a hide: the app lives in the tray, and
/// reopening a hidden popover keeps the UI's state. Other windows (Runs,
/// Settings) close for real and give their memory back.
pub fn on_window_event<R: Runtime>(window: &Window<R>, event: &WindowEvent) {
    if window.label() != POPOVER_LABEL {
        return;
    }
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

    const SCREEN: Area = Area {
        x: 0.0,
        y: 25.0,
        width: 1440.0,
        height: 875.0,
    };

    #[test]
    fn the_popover_hangs_centred_under_a_menu_bar_icon() {
        let icon = Area {
            x: 1000.0,
            y: 0.0,
            width: 24.0,
            height: 24.0,
        };
        let (x, y) = popover_origin(Some(icon), (380.0, 560.0), SCREEN);
        assert_eq!(x, 1012.0 - 190.0);
        assert_eq!(y, 28.0);
    }

    #[test]
    fn an_icon_at_the_screen_edge_keeps_the_popover_on_screen() {
        let icon = Area {
            x: 1420.0,
            y: 0.0,
            width: 20.0,
            height: 24.0,
        };
        let (x, _) = popover_origin(Some(icon), (380.0, 560.0), SCREEN);
        assert_eq!(x, 1440.0 - 380.0 - SCREEN_MARGIN);
    }

    #[test]
    fn a_taskbar_icon_at_the_bottom_opens_the_popover_above_it() {
        let icon = Area {
            x: 700.0,
            y: 870.0,
            width: 24.0,
            height: 30.0,
        };
        let (_, y) = popover_origin(Some(icon), (380.0, 560.0), SCREEN);
        assert_eq!(y, 870.0 - 560.0 - SCREEN_MARGIN / 2.0);
    }

    #[test]
    fn without_an_icon_position_the_popover_goes_top_right() {
        let (x, y) = popover_origin(None, (380.0, 560.0), SCREEN);
        assert_eq!(
            (x, y),
            (1440.0 - 380.0 - SCREEN_MARGIN, 25.0 + SCREEN_MARGIN)
        );
    }

    #[test]
    fn the_program_name_is_not_an_argument() {
        assert!(!shown_at_start(args(&["--show"])));
    }

    #[test]
    fn open_names_the_main_windows_view() {
        use crate::desktop::AppView;
        assert_eq!(
            view_at_start(args(&["ondo-app", "--open", "runs"])),
            Some(AppView::Runs)
        );
        assert_eq!(
            view_at_start(args(&["ondo-app", "--show", "--open", "settings"])),
            Some(AppView::Settings)
        );
        assert_eq!(view_at_start(args(&["ondo-app", "--open"])), None);
        assert_eq!(view_at_start(args(&["ondo-app", "--open", "nope"])), None);
    }
}
