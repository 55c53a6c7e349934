//! Authentication of requests: the scheme learnt at connect time, basic credentials, bearer
//! tokens per scope set (fetched from the realm, refreshed on a 401), and which token realms
//! may get the registry's credentials.

use super::*;

/// The environment variable that lets named registries' credentials go to a token service on
/// another host: `REGISTRY=REALM_HOST[,REGISTRY=REALM_HOST…]` (https realms only).
pub(crate) const ENV_REALMS: &str = "INFER_BUILD_REGISTRY_REALMS";

/// Docker Hub's token service, the one realm on another host that gets a registry's
/// credentials without being asked (Docker Hub's own clients send them there).
pub(crate) const DOCKER_HUB_REALM: &str = "https://auth.docker.io";

/// The pairs of [`ENV_REALMS`] from the environment `var` reads; an error names the entry
/// that is not `REGISTRY=HOST`.
pub(crate) fn trusted_realms_from(
    var: &dyn Fn(&str) -> Option<String>,
) -> Result<Vec<(String, String)>> {
    let Some(text) = var(ENV_REALMS) else {
        return Ok(Vec::new());
    };
    let mut out = Vec::new();
    for entry in text.split(',').map(str::trim).filter(|e| !e.is_empty()) {
        let bad = |why: &str| {
            Error::Setting {
            name: ENV_REALMS.into(),
            reason: format!(
                "`{}` is not REGISTRY=REALM_HOST (e.g. registry.gitlab.example.com=gitlab.example.com){why}",
                entry.chars().take(64).collect::<String>()
            ),
        }
        };
        let Some((r, h)) = entry.split_once('=').map(|(r, h)| (r.trim(), h.trim())) else {
            return Err(bad(""));
        };
        let host = |text: &str| RegistryHost::parse(text).map_err(|why| bad(&format!(": {why}")));
        let (r, h) = (host(r)?, host(h)?);
        out.push((
            super::super::reference::endpoint_of(r.as_str()).to_string(),
            h.to_string(),
        ));
    }
    Ok(out)
}

impl Client {
    /// One try, with authentication: a 401 is answered by (re)authenticating and resending
    /// once. Transport errors are returned as they are.
    pub fn attempt(&self, req: &Req, scopes: &[String]) -> std::result::Result<Resp, ureq::Error> {
        let resp = self.run_once(req, scopes)?;
        // Authentication happens only with the registry itself.
        if resp.status().as_u16() != 401 || !self.same_origin(&req.url) {
            return Ok(resp);
        }
        let challenge = resp
            .headers()
            .get("www-authenticate")
            .and_then(|v| v.to_str().ok())
            .and_then(parse_challenge);
        let Some(challenge) = challenge else {
            return Ok(resp);
        };
        match challenge {
            Challenge::Basic => {
                if self
                    .credential
                    .as_ref()
                    .and_then(Credential::basic_header)
                    .is_none()
                {
                    return Ok(resp);
                }
                {
                    let mut mode = self.mode.lock().unwrap_or_else(|p| p.into_inner());
                    if matches!(*mode, AuthMode::Basic) {
                        return Ok(resp); // credentials already sent and refused
                    }
                    *mode = AuthMode::Basic;
                }
                let again = self.run_once(req, scopes)?;
                if again.status().is_success() {
                    self.presented
                        .store(true, std::sync::atomic::Ordering::Relaxed);
                }
                return Ok(again);
            }
            Challenge::Bearer {
                realm,
                service,
                scope,
            } => {
                let mut all: Vec<String> = scopes.to_vec();
                if let Some(s) = scope {
                    for one in s.split(' ') {
                        if !all.iter().any(|x| x == one) {
                            all.push(one.to_string());
                        }
                    }
                }
                *self.mode.lock().unwrap_or_else(|p| p.into_inner()) = AuthMode::Bearer {
                    realm: realm.clone(),
                    service: service.clone(),
                };
                match self.fetch_token(&realm, service.as_deref(), &all) {
                    Ok(token) => {
                        let mut tokens = self.tokens.lock().unwrap_or_else(|p| p.into_inner());
                        tokens.insert(scope_key(scopes), token.clone());
                        tokens.insert(scope_key(&all), token);
                    }
                    // Not a refusal of the credentials: the realm itself is refused.
                    Err(e @ ureq::Error::RequireHttpsOnly(_)) => return Err(e),
                    Err(ureq::Error::Io(e)) if e.get_ref().is_some_and(|i| i.is::<Refused>()) => {
                        return Err(ureq::Error::Io(e))
                    }
                    Err(_) => return Ok(resp),
                }
            }
        }
        self.run_once(req, scopes)
    }

    pub(super) fn auth_header(&self, scopes: &[String]) -> Option<String> {
        let mode = self.mode.lock().unwrap_or_else(|p| p.into_inner());
        match &*mode {
            AuthMode::Anonymous => None,
            AuthMode::Basic => self.credential.as_ref().and_then(Credential::basic_header),
            AuthMode::Bearer { realm, service } => {
                let key = scope_key(scopes);
                if let Some(t) = self
                    .tokens
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .get(&key)
                {
                    return Some(format!("Bearer {t}"));
                }
                let (realm, service) = (realm.clone(), service.clone());
                drop(mode);
                // A new scope set: get its token up front instead of collecting a 401 first,
                // once, however many upload threads ask at the same moment.
                let _single = self.token_fetch.lock().unwrap_or_else(|p| p.into_inner());
                if let Some(t) = self
                    .tokens
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .get(&key)
                {
                    return Some(format!("Bearer {t}"));
                }
                let token = self.fetch_token(&realm, service.as_deref(), scopes).ok()?;
                self.tokens
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .insert(key, token.clone());
                Some(format!("Bearer {token}"))
            }
        }
    }

    /// The credentials a token endpoint gets: the registry's own when `realm` is on its origin
    /// (or is Docker Hub's token service, for Docker Hub); for a realm elsewhere, only those
    /// configured for the realm's own host (`infer-build login HOST`), looked up once.
    fn realm_credential(&self, realm: &str) -> Option<Credential> {
        if self.realm_gets_credentials(realm) {
            return self.credential.clone();
        }
        let host = realm_host(realm)?;
        let mut cache = self
            .realm_credentials
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let own = cache
            .entry(host.clone())
            .or_insert_with(|| self.opts.keychain.lookup(&host).ok().flatten())
            .clone();
        if own.is_none() && self.credential.is_some() {
            *self
                .withheld_realm
                .lock()
                .unwrap_or_else(|p| p.into_inner()) = Some(host);
        }
        own
    }

    /// True when the registry's credentials may go to the token endpoint `realm`: it is on the
    /// registry's own origin, or it is Docker Hub's token service for Docker Hub.
    ///
    /// Also a realm whose host the user paired with this registry in [`ENV_REALMS`], over
    /// https only.
    fn realm_gets_credentials(&self, realm: &str) -> bool {
        self.same_origin(realm)
            || (self.registry == super::super::reference::DOCKER_HUB_API
                && origin(realm).is_some_and(|o| origin(DOCKER_HUB_REALM) == Some(o)))
            || realm_host(realm).is_some_and(|host| {
                realm.starts_with("https://")
                    && self
                        .opts
                        .trusted_realms
                        .iter()
                        .any(|(r, h)| self.registry == r.as_str() && h == &host)
            })
    }

    /// Ask the token endpoint for a token covering `scopes`. The registry's credentials go
    /// with the request only when [`Client::realm_gets_credentials`]; otherwise the token is
    /// asked for anonymously. A plain-HTTP realm of a TLS registry is refused.
    fn fetch_token(
        &self,
        realm: &str,
        service: Option<&str>,
        scopes: &[String],
    ) -> std::result::Result<String, ureq::Error> {
        if !self.opts.insecure && !realm.starts_with("https://") {
            return Err(ureq::Error::RequireHttpsOnly(format!(
                "the TLS registry {} names the token realm `{}`: realm scheme downgrade to plain HTTP refused (nothing was sent to it)",
                self.registry,
                strip_query(realm)
            )));
        }
        let credential = self.realm_credential(realm);
        let credential = credential.as_ref();
        let mut last_err = None;
        for attempt in 1..=self.opts.max_attempts.min(4) {
            if self.out_of_time() {
                break;
            }
            let resp = match credential {
                Some(Credential::IdentityToken(refresh)) => {
                    let mut form = vec![
                        ("grant_type", "refresh_token".to_string()),
                        ("refresh_token", refresh.clone()),
                        ("client_id", "infer-build".to_string()),
                        ("scope", scopes.join(" ")),
                    ];
                    if let Some(s) = service {
                        form.push(("service", s.to_string()));
                    }
                    let mut r = self.agent.post(realm);
                    if let Some(left) = self.time_left() {
                        r = r.config().timeout_global(Some(left)).build();
                    }
                    r.send_form(form)
                }
                other => {
                    let mut r = self.agent.get(realm);
                    if let Some(left) = self.time_left() {
                        r = r.config().timeout_global(Some(left)).build();
                    }
                    if let Some(s) = service {
                        r = r.query("service", s);
                    }
                    for s in scopes {
                        r = r.query("scope", s);
                    }
                    if let Some(h) = other.and_then(|c| c.basic_header()) {
                        r = r.header("authorization", h);
                    }
                    r.call()
                }
            };
            match resp {
                Ok(mut resp) if resp.status().is_success() => {
                    #[derive(serde::Deserialize)]
                    struct Token {
                        token: Option<String>,
                        access_token: Option<String>,
                    }
                    let body = resp
                        .body_mut()
                        .with_config()
                        .limit(MAX_TOKEN)
                        .read_to_vec()?;
                    let t: Token = serde_json::from_slice(&body).map_err(|_| {
                        ureq::Error::BadUri(
                            "token endpoint answered something that is not JSON".into(),
                        )
                    })?;
                    let token = t.token.or(t.access_token).ok_or_else(|| {
                        ureq::Error::BadUri("token endpoint answered without a token".into())
                    })?;
                    if credential.is_some() {
                        self.presented
                            .store(true, std::sync::atomic::Ordering::Relaxed);
                    }
                    return Ok(token);
                }
                Ok(resp) if retryable_status(resp.status().as_u16()) => {
                    self.pause(attempt, retry_after(&resp));
                    last_err = Some(ureq::Error::StatusCode(resp.status().as_u16()));
                }
                Ok(resp) => return Err(ureq::Error::StatusCode(resp.status().as_u16())),
                Err(e) if retryable_error(&e) && !matches!(e, ureq::Error::Timeout(_)) => {
                    self.pause(attempt, None);
                    last_err = Some(e);
                }
                Err(e) => return Err(e),
            }
        }
        Err(last_err.unwrap_or(ureq::Error::StatusCode(503)))
    }
}

pub(super) fn scope_key(scopes: &[String]) -> String {
    let mut s = scopes.to_vec();
    s.sort();
    s.join(" ")
}

/// The host (and port) of a token realm URL, canonical ([`RegistryHost`]); `None` for one with
/// user info or no host.
pub(super) fn realm_host(realm: &str) -> Option<String> {
    let host = realm.split_once("://")?.1.split(['/', '?', '#']).next()?;
    if host.contains('@') {
        return None;
    }
    RegistryHost::parse(host).ok().map(|h| h.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trusted_realms_are_registry_host_pairs() {
        let env = |v: &'static str| move |k: &str| (k == ENV_REALMS).then(|| v.to_string());
        assert_eq!(trusted_realms_from(&|_: &str| None).unwrap(), vec![]);
        assert_eq!(
            trusted_realms_from(&env(
                " Registry.GitLab.example.com=gitlab.example.com , docker.io=login.example:8443,"
            ))
            .unwrap(),
            vec![
                (
                    "registry.gitlab.example.com".to_string(),
                    "gitlab.example.com".to_string()
                ),
                // Docker Hub's name stands for its API host, the client's registry.
                (
                    "registry-1.docker.io".to_string(),
                    "login.example:8443".to_string()
                ),
            ]
        );
        // Both sides canonical: the pair matches the registry and realm however spelled.
        assert_eq!(
            trusted_realms_from(&env("127.1:5301=Auth.Example.:443")).unwrap(),
            vec![("127.0.0.1:5301".to_string(), "auth.example".to_string())]
        );
        for bad in [
            "r.io",
            "=h",
            "r.io=",
            "r.io=https://h/x",
            "u@r.io=h",
            "r.io=h:99999",
            "r.io#x=h",
        ] {
            let e = trusted_realms_from(&env(bad)).unwrap_err();
            assert!(
                e.is_bad_input() && e.to_string().contains(ENV_REALMS),
                "{bad}: {e}"
            );
        }
    }
}
