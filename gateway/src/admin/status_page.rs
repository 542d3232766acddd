//! The HTML status page.

use std::fmt::Write;

use crate::backend::BackendStatus;

/// Escapes text for HTML element content.
fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// Renders one table row per backend.
pub(super) fn render(backends: &[BackendStatus]) -> String {
    let mut page = String::from(
        "<!doctype html><html><head><meta charset=\"utf-8\"><title>gateway status</title>\
         <style>body{font-family:sans-serif}td,th{padding:2px 10px;text-align:left}\
         .up{background:#cfc}.down{background:#fcc}.off{background:#eee}</style></head><body>\
         <h1>gateway</h1><table><tr><th>frontend</th><th>backend</th><th>address</th><th>health</th>\
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
