//! The HTML status page.

use std::fmt::Write;

use crate::backend::BackendStatus;
use crate::vip::VipStatus;

/// Escapes text for HTML element content.
fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// The VIP's line above the table.
fn vip_line(vip: &VipStatus) -> String {
    format!(
        "<p>virtual IP {} on {}: <b>{}</b> (state {:?}, acquired {} times, released {} times, holder: {})</p>",
        escape(&vip.address),
        escape(&vip.interface),
        if vip.holder { "held here" } else { "not held here" },
        vip.state,
        vip.acquired,
        vip.released,
        escape(vip.current_holder.as_deref().unwrap_or("unknown")),
    )
}

/// Renders the VIP's line and one table row per backend.
pub(super) fn render(backends: &[BackendStatus], vip: Option<&VipStatus>) -> String {
    let mut page = String::from(
        "<!doctype html><html><head><meta charset=\"utf-8\"><title>gateway status</title>\
         <style>body{font-family:sans-serif}td,th{padding:2px 10px;text-align:left}\
         .up{background:#cfc}.down{background:#fcc}.off{background:#eee}</style></head><body>\
         <h1>gateway</h1>",
    );
    if let Some(vip) = vip {
        page.push_str(&vip_line(vip));
    }
    page.push_str(
        "<table><tr><th>frontend</th><th>backend</th><th>address</th><th>health</th>\
         <th>admin</th><th>weight</th><th>effective</th><th>open</th><th>limit</th><th>last error</th></tr>",
    );
    for backend in backends {
        let class = match (backend.serving(), backend.health) {
            (true, _) => "up",
            (false, "down") => "down",
            _ => "off",
        };
        let limit = backend
            .max_connections
            .map_or_else(|| "-".to_string(), |max| max.to_string());
        let _ = write!(
            page,
            "<tr class=\"{class}\"><td>{}</td><td>{}</td><td>{}</td><td>{}{}</td><td>{:?}</td><td>{}</td>\
             <td>{:.0}</td><td>{}</td><td>{limit}</td><td>{}</td></tr>",
            escape(&backend.frontend),
            escape(&backend.name),
            escape(&backend.address),
            backend.health,
            if backend.suspect { " (suspect)" } else { "" },
            backend.admin,
            backend.weight,
            backend.effective_weight,
            backend.open_connections,
            escape(backend.last_check_error.as_deref().unwrap_or("")),
        );
    }
    page.push_str("</table></body></html>\n");
    page
}
