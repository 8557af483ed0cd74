//! The menu-bar (tray) icon and its menu: Open toggles the popover, Quit ends
//! the app. On Linux a left click opens the menu, since there is no click
//! event there; on macOS a left click toggles the popover directly.

use tauri::menu::{Menu, MenuEvent, MenuItem, PredefinedMenuItem};
use tauri::tray::TrayIconBuilder;
use tauri::{AppHandle, Runtime};

use crate::window;

const TRAY_ID: &str = "ondo";
const MENU_OPEN: &str = "open";
const MENU_QUIT: &str = "quit";

/// Creates the tray icon; the app keeps it until it exits.
pub fn create<R: Runtime>(app: &AppHandle<R>) -> tauri::Result<()> {
    let open = MenuItem::with_id(app, MENU_OPEN, "Open", true, None::<&str>)?;
    let quit = MenuItem::with_id(app, MENU_QUIT, "Quit Ondo", true, None::<&str>)?;
    let separator = PredefinedMenuItem::separator(app)?;
    let menu = Menu::with_items(app, &[&open, &separator, &quit])?;

    let builder = TrayIconBuilder::with_id(TRAY_ID)
        .tooltip("Ondo")
        .menu(&menu)
        .on_menu_event(on_menu_event);
    platform_look(builder).build(app)?;
    Ok(())
}

fn on_menu_event<R: Runtime>(app: &AppHandle<R>, event: MenuEvent) {
    match event.id().as_ref() {
        MENU_OPEN => {
            if let Err(error) = window::toggle(app) {
                eprintln!("ondo-app: could not open the window: {error}");
            }
        }
        // An explicit exit code is what tells ExitRequested this is a real quit.
        MENU_QUIT => app.exit(0),
        _ => {}
    }
}

/// macOS: a template image (the system tints it for light and dark menu bars),
/// the menu on right click, and a left click that toggles the popover.
#[cfg(target_os = "macos")]
fn platform_look<R: Runtime>(builder: TrayIconBuilder<R>) -> TrayIconBuilder<R> {
    use tauri::tray::{MouseButton, MouseButtonState, TrayIconEvent};

    builder
        .icon(tauri::include_image!("../icons/tray-template@2x.png"))
        .icon_as_template(true)
        .show_menu_on_left_click(false)
        .on_tray_icon_event(|tray, event| {
            if let TrayIconEvent::Click {
                button: MouseButton::Left,
                button_state: MouseButtonState::Up,
                ..
            } = event
                && let Err(error) = window::toggle(tray.app_handle())
            {
                eprintln!("ondo-app: could not toggle the window: {error}");
            }
        })
}

/// Linux and Windows: the coloured icon; a left click opens the menu.
#[cfg(not(target_os = "macos"))]
fn platform_look<R: Runtime>(builder: TrayIconBuilder<R>) -> TrayIconBuilder<R> {
    builder
        .icon(tauri::include_image!("../icons/tray.png"))
        .show_menu_on_left_click(true)
}
