//! Login sessions of the console: the account a browser works as.
//!
//! Owns: the table of sessions (a random id in an `HttpOnly` cookie → the account's credentials
//! and an admin client made with them), kept in this process's memory only; the secret never
//! goes back to the page. A request without a session works as the account of the command
//! line (`--access-key`, …; none by default). Never: checking permissions itself: the servers
//! do, and their refusals come back as errors (`ACCESS_DENIED`).
//!
//! Data enters as the login form's JSON and the `Cookie` header; it leaves as a [`Caller`]
//! (the settings and admin client a handler uses) and a `Set-Cookie` header.

use std::collections::HashMap;
use std::io::Read;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::{FromRequestParts, State};
use axum::http::header::{COOKIE, SET_COOKIE};
use axum::http::request::Parts;
use axum::http::HeaderMap;
use axum::response::{AppendHeaders, IntoResponse};
use axum::Json;
use serde_json::json;
use shardmq_client::{Admin, Credentials};

use super::{text_field, ApiError, ApiResult, Console, JsonBody};
use crate::cli::{CredentialsOf, Settings};

/// Name of the session cookie.
const SESSION_COOKIE: &str = "shardmq_console_session";

/// Most sessions kept at once; a login beyond it ends the least recently used one.
const MAX_SESSIONS: usize = 256;

/// A session unused this long is forgotten (its browser logs in again).
const SESSION_IDLE_LIMIT: Duration = Duration::from_secs(12 * 3600);

/// Random bytes in a session id (shown as hex).
const SESSION_ID_BYTES: usize = 16;

struct Session {
    credentials: Credentials,
    admin: Arc<Admin>,
    last_used: Instant,
}

/// Every login, and the admin client of requests without one.
pub struct Sessions {
    default_admin: Arc<Admin>,
    by_id: Mutex<HashMap<String, Session>>,
}

/// Who a request works as: the settings (with its account's credentials) and an admin client
/// made with them.
pub struct Caller {
    pub settings: Settings,
    pub admin: Arc<Admin>,
}

fn settings_with(base: &Settings, credentials: Option<Credentials>) -> Settings {
    Settings {
        namesrv: base.namesrv.clone(),
        is_json: true,
        request_timeout: base.request_timeout,
        credentials,
    }
}

impl Sessions {
    pub async fn new(settings: &Settings) -> anyhow::Result<Sessions> {
        Ok(Sessions {
            default_admin: Arc::new(crate::commands::admin(settings).await?),
            by_id: Mutex::new(HashMap::new()),
        })
    }

    /// The admin client of requests without a session (the command line's account).
    pub fn default_admin(&self) -> Arc<Admin> {
        Arc::clone(&self.default_admin)
    }

    fn table(&self) -> std::sync::MutexGuard<'_, HashMap<String, Session>> {
        // A panic while the lock was held leaves a table that is still consistent (every
        // change is one insert or remove).
        self.by_id
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The session's credentials and admin client, if `id` names a live one.
    fn touch(&self, id: &str) -> Option<(Credentials, Arc<Admin>)> {
        let mut table = self.table();
        let session = table.get_mut(id)?;
        if session.last_used.elapsed() > SESSION_IDLE_LIMIT {
            table.remove(id);
            return None;
        }
        session.last_used = Instant::now();
        Some((session.credentials.clone(), Arc::clone(&session.admin)))
    }

    fn insert(&self, id: String, credentials: Credentials, admin: Arc<Admin>) {
        let mut table = self.table();
        table.retain(|_, session| session.last_used.elapsed() <= SESSION_IDLE_LIMIT);
        while table.len() >= MAX_SESSIONS {
            let Some(oldest) = table
                .iter()
                .min_by_key(|(_, session)| session.last_used)
                .map(|(id, _)| id.clone())
            else {
                break;
            };
            table.remove(&oldest);
        }
        table.insert(
            id,
            Session {
                credentials,
                admin,
                last_used: Instant::now(),
            },
        );
    }
}

fn session_id(headers: &HeaderMap) -> Option<String> {
    headers
        .get_all(COOKIE)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|cookies| cookies.split(';'))
        .find_map(|cookie| {
            let (name, value) = cookie.trim().split_once('=')?;
            (name == SESSION_COOKIE).then(|| value.to_owned())
        })
}

/// A new session id: random bytes from the kernel, as hex.
fn new_session_id() -> anyhow::Result<String> {
    let mut bytes = [0u8; SESSION_ID_BYTES];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut random| random.read_exact(&mut bytes))
        .map_err(|error| anyhow::anyhow!("cannot read /dev/urandom for a session id: {error}"))?;
    Ok(bytes.iter().map(|byte| format!("{byte:02x}")).collect())
}

impl FromRequestParts<Arc<Console>> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut Parts,
        console: &Arc<Console>,
    ) -> Result<Self, Self::Rejection> {
        let logged_in = session_id(&parts.headers).and_then(|id| console.sessions.touch(&id));
        Ok(match logged_in {
            Some((credentials, admin)) => Caller {
                settings: settings_with(&console.settings, Some(credentials)),
                admin,
            },
            None => Caller {
                settings: settings_with(&console.settings, console.settings.credentials.clone()),
                admin: Arc::clone(&console.sessions.default_admin),
            },
        })
    }
}

/// `GET /api/session`: the account this browser works as.
pub async fn current(State(console): State<Arc<Console>>, headers: HeaderMap) -> ApiResult {
    let logged_in = session_id(&headers).and_then(|id| console.sessions.touch(&id));
    let default_account = console
        .settings
        .credentials
        .as_ref()
        .map(|credentials| credentials.access_key().to_owned());
    let admin = logged_in.as_ref().map_or_else(
        || console.sessions.default_admin(),
        |(_, admin)| Arc::clone(admin),
    );
    Ok(Json(json!({
        "account": logged_in.as_ref().map(|(credentials, _)| credentials.access_key()),
        "default_account": default_account,
        "namesrv": console.settings.namesrv,
        "may_admin": may_admin(&admin).await,
    })))
}

/// Whether `admin`'s account may make admin calls, as the first master broker of the cluster
/// listing said when the account authenticated there; `None` when that is unknown (no access
/// control, no account, no master reachable), and the page then shows every control.
async fn may_admin(admin: &Admin) -> Option<bool> {
    let clusters = admin.cluster_info().await.ok()?;
    let address = clusters
        .iter()
        .find_map(|cluster| cluster.master_addresses().first().map(|a| (*a).to_owned()))?;
    admin.account_is_admin(&address).await.ok().flatten()
}

/// `POST /api/login` `{access_key, secret_key}`: checks the account against the name server (a
/// cluster listing) and starts a session for it.
pub async fn login(
    State(console): State<Arc<Console>>,
    JsonBody(body): JsonBody,
) -> Result<impl IntoResponse, ApiError> {
    let access_key = text_field(&body, "access_key")?;
    let secret_key = text_field(&body, "secret_key")?;
    let credentials = Credentials::new(access_key, secret_key)
        .map_err(|error| ApiError::bad_request(error.to_string()))?;
    let settings = settings_with(&console.settings, Some(credentials.clone()));
    let admin = Admin::builder()
        .namesrv(&settings.namesrv)
        .request_timeout(settings.request_timeout)
        .credentials_of(&settings)
        .build()
        .await?;
    if let Err(error) = admin.cluster_info().await {
        admin.shutdown().await;
        return Err(error.into());
    }
    let may_admin = may_admin(&admin).await;
    let id = new_session_id()?;
    console
        .sessions
        .insert(id.clone(), credentials, Arc::new(admin));
    let cookie = format!("{SESSION_COOKIE}={id}; Path=/; HttpOnly; SameSite=Strict");
    Ok((
        AppendHeaders([(SET_COOKIE, cookie)]),
        Json(json!({ "account": access_key, "may_admin": may_admin })),
    ))
}

/// `POST /api/logout`: ends this browser's session.
pub async fn logout(
    State(console): State<Arc<Console>>,
    headers: HeaderMap,
) -> Result<impl IntoResponse, ApiError> {
    let ended = session_id(&headers).and_then(|id| console.sessions.table().remove(&id));
    if let Some(session) = ended {
        session.admin.shutdown().await;
    }
    let cookie = format!("{SESSION_COOKIE}=; Path=/; HttpOnly; SameSite=Strict; Max-Age=0");
    Ok((
        AppendHeaders([(SET_COOKIE, cookie)]),
        Json(json!({ "account": null })),
    ))
}
