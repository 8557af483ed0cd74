//! The menu-bar (tray) icon and its menu: Open toggles the popover, Models
//! opens it on its Models section, Runs and Settings open the main window,
//! Quit ends the app. On Linux a left click opens the menu, since there is
//! no click event there; on macOS a left click toggles the popover directly.

use tauri::menu::{Menu, MenuEvent, MenuItem, PredefinedMenuItem};
use tauri::tray::TrayIconBuilder;
use tauri::{AppHandle, Runtime};

use crate::desktop::{self, AppView};
use crate::{events, window};

const TRAY_ID: &str = "ondo";
const MENU_OPEN: &str = "open";
const MENU_MODELS: &str = "models";
const MENU_RUNS: &str = "runs";
const MENU_SETTINGS: &str = "settings";
const MENU_QUIT: &str = "quit";

/// Creates the tray icon; the app keeps it until it exits.
pub fn create<R: Runtime>(app: &AppHandle<R>) -> tauri::Result<()> {
    let item = |id: &str, text: &str, accelerator: Option<&str>| {
        MenuItem::with_id(app, id, text, true, accelerator)
    };
    let open = item(MENU_OPEN, "Open Ondo", None)?;
    let models = item(MENU_MODELS, "Models…", None)?;
    let runs = item(MENU_RUNS, "Runs…", Some("CmdOrCtrl+R"))?;
    let settings = item(MENU_SETTINGS, "Settings…", Some("CmdOrCtrl+,"))?;
    let quit = item(MENU_QUIT, "Quit Ondo", Some("CmdOrCtrl+Q"))?;
    let separator = || PredefinedMenuItem::separator(app);
    let menu = Menu::with_items(
        app,
        &[
            &open,
            &models,
            &separator()?,
            &runs,
            &settings,
            &separator()?,
            &quit,
        ],
    )?;

    let builder = TrayIconBuilder::with_id(TRAY_ID)
        .tooltip("Ondo")
        .menu(&menu)
        .on_menu_event(on_menu_event);
    platform_look(builder).build(app)?;
    Ok(())
}

fn on_menu_event<R: Runtime>(app: &AppHandle<R>, event: MenuEvent) {
    let done = match event.id().as_ref() {
        MENU_OPEN => window::toggle(app),
        MENU_MODELS => window::show(app).map(|()| {
            events::AppEvent::Navigate {
                view: events::NavigateView::Models,
            }
            .send_to(app, window::POPOVER_LABEL)
        }),
        MENU_RUNS => desktop::open_workspace(app, AppView::Runs),
        MENU_SETTINGS => desktop::open_workspace(app, AppView::Settings),
        // An explicit exit code is what tells ExitRequested this is a real quit.
        MENU_QUIT => {
            app.exit(0);
            Ok(())
        }
        _ => Ok(()),
    };
    if let Err(error) = done {
        eprintln!("ondo-app: the menu item could not open its window: {error}");
    }
}

/// macOS: a template image (the system tints it for light and dark menu bars),
/// the menu on right click, and a left click that toggles the popover under
/// the icon.
#[cfg(target_os = "macos")]
fn platform_look<R: Runtime>(builder: TrayIconBuilder<R>) -> TrayIconBuilder<R> {
    use tauri::Manager;
    use tauri::tray::{MouseButton, MouseButtonState, TrayIconEvent};

    builder
        .icon(tauri::include_image!("../icons/tray-template@2x.png"))
        .icon_as_template(true)
        .show_menu_on_left_click(false)
        .on_tray_icon_event(|tray, event| {
            if let TrayIconEvent::Click {
                button: MouseButton::Left,
                button_state: MouseButtonState::Up,
                rect,
                ..
            } = event
            {
                let app = tray.app_handle();
                let scale = app
                    .primary_monitor()
                    .ok()
                    .flatten()
                    .map_or(1.0, |m| m.scale_factor());
                let position = rect.position.to_physical::<f64>(scale);
                let size = rect.size.to_physical::<f64>(scale);
                if let Some(anchor) = app.try_state::<window::TrayAnchor>() {
                    *anchor.0.lock().unwrap_or_else(|p| p.into_inner()) = Some(window::Area {
                        x: position.x,
                        y: position.y,
                        width: size.width,
                        height: size.height,
                    });
                }
                if let Err(error) = window::toggle(app) {
                    eprintln!("ondo-app: could not toggle the window: {error}");
                }
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
