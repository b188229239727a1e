//! The console's pages: one HTML page, its script modules and its style sheet, embedded in the
//! binary (`console_assets/`), served with a content security policy that lets them load
//! nothing from elsewhere.
//!
//! Owns: the asset table. Never: data (the pages fetch it from `/api/`).

use std::sync::Arc;

use axum::http::header::{CACHE_CONTROL, CONTENT_SECURITY_POLICY, CONTENT_TYPE};
use axum::http::{HeaderName, HeaderValue};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;

use super::Console;

/// Every asset: its path, content type and bytes.
const ASSETS: &[(&str, &str, &str)] = &[
    (
        "/",
        "text/html; charset=utf-8",
        include_str!("../console_assets/index.html"),
    ),
    (
        "/app.js",
        "text/javascript; charset=utf-8",
        include_str!("../console_assets/app.js"),
    ),
    (
        "/pages.js",
        "text/javascript; charset=utf-8",
        include_str!("../console_assets/pages.js"),
    ),
    (
        "/chart.js",
        "text/javascript; charset=utf-8",
        include_str!("../console_assets/chart.js"),
    ),
    (
        "/style.css",
        "text/css; charset=utf-8",
        include_str!("../console_assets/style.css"),
    ),
];

/// Only this server's own scripts, styles, images and API.
const POLICY: &str =
    "default-src 'self'; img-src 'self' data:; object-src 'none'; frame-ancestors 'none'";

pub fn router() -> Router<Arc<Console>> {
    let mut router = Router::new();
    for &(path, content_type, body) in ASSETS {
        router = router.route(
            path,
            get(move || async move {
                (
                    [
                        (CONTENT_TYPE, HeaderValue::from_static(content_type)),
                        (CACHE_CONTROL, HeaderValue::from_static("no-cache")),
                        (CONTENT_SECURITY_POLICY, HeaderValue::from_static(POLICY)),
                        (
                            HeaderName::from_static("x-content-type-options"),
                            HeaderValue::from_static("nosniff"),
                        ),
                    ],
                    body,
                )
                    .into_response()
            }),
        );
    }
    router
}
