//! A registry's host and port in one canonical spelling, and what kind of address a host is.
//! Pure: no I/O, no name resolution.
//!
//! Every place that compares registry names (`blocked`, mirrors and locations of
//! registries.conf, credentials-file keys, `INFER_BUILD_REGISTRY`, token-realm pairs, origins)
//! compares [`RegistryHost`]s, so a name cannot be spelled around a rule: ASCII case, a trailing
//! dot, the default port (`:443`), an IPv4 address in any of the forms the system resolver
//! accepts (`127.1`, `2130706433`, `0x7f.1`, `0177.0.0.1`, `127.0.0.01`) and an IPv4 address
//! written as IPv4-mapped IPv6 (`[::ffff:127.0.0.1]`) all give the one name the connection
//! goes to. Anything that is not a host name, an IPv4 address or a bracketed IPv6 address, or a
//! port outside 1..=65535, is refused with the reason.
//!
//! `localhost` is a name, not `127.0.0.1`: what it resolves to is the system's choice (`::1`,
//! `127.0.0.1`, or both, a different socket each), and podman, skopeo and credentials files
//! treat the two as different registries too.
//!
//! [`AddressKind`] and [`redirect_refusal`] decide where a registry may send the client
//! (redirects, upload locations, token realms): never to a link-local address, to a loopback
//! address other than the registry's own, or to a private one unless the registry is there.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// Why a text is not a registry name (`host[:port]`). The message is the reason, without the
/// input: callers name the input and where it came from.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NameError {
    #[error("the registry host is empty")]
    EmptyRegistry,
    #[error("the host is empty")]
    EmptyHost,
    #[error("an IPv6 address ends with `]`")]
    UnclosedIpv6,
    #[error("an IPv6 zone (`%…`) is not a registry address")]
    Ipv6Zone,
    #[error("`[{0}]` is not an IPv6 address")]
    NotIpv6(String),
    #[error("an IPv6 address is written in brackets (`[::1]:5000`)")]
    Ipv6WithoutBrackets,
    /// A character no host name has, quoted, or as its code point (`U+00E9`).
    #[error("{0} is not allowed in a host name (letters, digits, `-` and `.`, or an IPv6 address in brackets)")]
    Character(String),
    #[error("a host name is at most 253 characters")]
    NameTooLong,
    #[error("`{0}` ends in a number but is not an IPv4 address")]
    NotIpv4(String),
    #[error("`{0}` has an empty label (`..`)")]
    EmptyLabel(String),
    #[error("a host name's labels are at most 63 characters")]
    LabelTooLong,
    #[error("`{0}`: a host name's labels do not start or end with `-`")]
    LabelHyphen(String),
    #[error("the port after `:` is empty")]
    EmptyPort,
    /// Not digits (at most 16 characters of it kept).
    #[error("`{0}` is not a port (1 to 65535)")]
    NotPort(String),
    #[error("port {0} is out of range (1 to 65535)")]
    PortRange(String),
}

/// The HTTPS port: a registry name without a port means it, so `host:443` is `host`.
pub(crate) const DEFAULT_PORT: u16 = 443;
/// Docker Hub's older name, the same registry as `docker.io`.
const DOCKER_HUB_LEGACY: &str = "index.docker.io";

/// A host: a lowercase DNS name without a trailing dot, or an IP address.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) enum Host {
    Name(String),
    V4(Ipv4Addr),
    V6(Ipv6Addr),
}

impl Host {
    /// Parse the host part of a registry name or URL authority (no port): see the module
    /// documentation for what is accepted. The error is the reason, without the input.
    pub(crate) fn parse(input: &str) -> Result<Host, NameError> {
        if let Some(inner) = input.strip_prefix('[') {
            let inner = inner.strip_suffix(']').ok_or(NameError::UnclosedIpv6)?;
            if inner.contains('%') {
                return Err(NameError::Ipv6Zone);
            }
            let v6: Ipv6Addr = inner
                .parse()
                .map_err(|_| NameError::NotIpv6(inner.to_owned()))?;
            return Ok(match v6.to_ipv4_mapped() {
                Some(v4) => Host::V4(v4),
                None => Host::V6(v6),
            });
        }
        if input.contains(':') {
            return Err(NameError::Ipv6WithoutBrackets);
        }
        let name = input.strip_suffix('.').unwrap_or(input);
        if name.is_empty() {
            return Err(NameError::EmptyHost);
        }
        if let Some(c) = name
            .chars()
            .find(|c| !(c.is_ascii_alphanumeric() || *c == '-' || *c == '.'))
        {
            return Err(NameError::Character(shown_char(c)));
        }
        let name = name.to_ascii_lowercase();
        if name.len() > 253 {
            return Err(NameError::NameTooLong);
        }
        let labels: Vec<&str> = name.split('.').collect();
        if ends_in_a_number(&labels) {
            return ipv4(&labels)
                .map(Host::V4)
                .ok_or_else(|| NameError::NotIpv4(name.clone()));
        }
        for label in &labels {
            if label.is_empty() {
                return Err(NameError::EmptyLabel(name.clone()));
            }
            if label.len() > 63 {
                return Err(NameError::LabelTooLong);
            }
            if label.starts_with('-') || label.ends_with('-') {
                return Err(NameError::LabelHyphen((*label).to_owned()));
            }
        }
        Ok(Host::Name(name))
    }
}

impl std::fmt::Display for Host {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Host::Name(n) => f.write_str(n),
            Host::V4(a) => write!(f, "{a}"),
            Host::V6(a) => write!(f, "[{a}]"),
        }
    }
}

/// A character for a message: printable ASCII quoted, anything else as its code point.
fn shown_char(c: char) -> String {
    if c.is_ascii_graphic() {
        format!("`{c}`")
    } else {
        format!("U+{:04X}", c as u32)
    }
}

/// The WHATWG URL rule: a host whose last label is a number (decimal, or `0x` hex) is an IPv4
/// address, whatever else it holds, as the system resolver reads it.
fn ends_in_a_number(labels: &[&str]) -> bool {
    let mut last = labels.last().copied().unwrap_or("");
    if last.is_empty() && labels.len() > 1 {
        last = labels[labels.len() - 2];
    }
    if !last.is_empty() && last.bytes().all(|b| b.is_ascii_digit()) {
        return true;
    }
    last.strip_prefix("0x")
        .is_some_and(|h| h.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// An IPv4 address as `inet_aton` (and so `getaddrinfo`, which connects) reads it: one to four
/// parts, each decimal, octal (a leading `0`) or hex (`0x`), the last filling the bytes left.
fn ipv4(labels: &[&str]) -> Option<Ipv4Addr> {
    if labels.is_empty() || labels.len() > 4 {
        return None;
    }
    let mut numbers = Vec::with_capacity(4);
    for part in labels {
        let (digits, radix) = if let Some(h) = part.strip_prefix("0x") {
            (h, 16)
        } else if part.len() > 1 && part.starts_with('0') {
            (&part[1..], 8)
        } else {
            (*part, 10)
        };
        let n = if digits.is_empty() {
            if radix == 10 {
                return None;
            }
            0
        } else {
            u64::from_str_radix(digits, radix).ok()?
        };
        numbers.push(n);
    }
    let (last, first) = numbers.split_last()?;
    if first.iter().any(|n| *n > 255) || *last >= 256u64.pow(5 - numbers.len() as u32) {
        return None;
    }
    let mut value = *last;
    for (i, n) in first.iter().enumerate() {
        value += n << (8 * (3 - i));
    }
    Some(Ipv4Addr::from(u32::try_from(value).ok()?))
}

/// A port: 1 to 65535, digits only.
pub(crate) fn parse_port(text: &str) -> Result<u16, NameError> {
    if text.is_empty() {
        return Err(NameError::EmptyPort);
    }
    let shown = || text.chars().take(16).collect::<String>();
    if !text.bytes().all(|b| b.is_ascii_digit()) {
        return Err(NameError::NotPort(shown()));
    }
    match text.parse::<u32>() {
        Ok(p @ 1..=65535) => Ok(p as u16),
        _ => Err(NameError::PortRange(shown())),
    }
}

/// Split `host[:port]` (the host possibly `[v6]`) into its two texts.
pub(crate) fn split_port(input: &str) -> (&str, Option<&str>) {
    if input.starts_with('[') {
        return match input.find(']') {
            Some(end) => match input[end + 1..].strip_prefix(':') {
                Some(port) => (&input[..=end], Some(port)),
                None => (input, None),
            },
            None => (input, None),
        };
    }
    match input.split_once(':') {
        Some((h, p)) => (h, Some(p)),
        None => (input, None),
    }
}

/// A registry's name, canonical: the host (a DNS name or an IP address) and the port, `None` for the default
/// (443). `docker.io`'s older name `index.docker.io` is `docker.io`. Two spellings of one
/// registry are equal; the text ([`RegistryHost::as_str`]) is what messages, plans and
/// reports show.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RegistryHost {
    text: String,
    host: Host,
    port: Option<u16>,
}

impl RegistryHost {
    /// Parse `host[:port]`. The error is the reason, without the input (callers name it and
    /// where it came from).
    pub fn parse(input: &str) -> Result<RegistryHost, NameError> {
        if input.is_empty() {
            return Err(NameError::EmptyRegistry);
        }
        if !input.starts_with('[') && input.matches(':').count() > 1 {
            return Err(NameError::Ipv6WithoutBrackets);
        }
        let (host, port) = split_port(input);
        let mut host = Host::parse(host)?;
        if host == Host::Name(DOCKER_HUB_LEGACY.into()) {
            host = Host::Name(super::reference::DOCKER_HUB.into());
        }
        let port = port
            .map(parse_port)
            .transpose()?
            .filter(|p| *p != DEFAULT_PORT);
        let text = match port {
            Some(p) => format!("{host}:{p}"),
            None => host.to_string(),
        };
        Ok(RegistryHost { text, host, port })
    }

    /// Docker Hub's name, `docker.io`.
    pub(crate) fn docker_hub() -> RegistryHost {
        let name = super::reference::DOCKER_HUB;
        RegistryHost {
            text: name.into(),
            host: Host::Name(name.into()),
            port: None,
        }
    }

    /// `host[:port]`, canonical.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    pub(crate) fn host(&self) -> &Host {
        &self.host
    }
}

impl std::fmt::Display for RegistryHost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.text)
    }
}

impl PartialEq<str> for RegistryHost {
    fn eq(&self, other: &str) -> bool {
        self.text == other
    }
}

impl PartialEq<&str> for RegistryHost {
    fn eq(&self, other: &&str) -> bool {
        self.text == *other
    }
}

/// What kind of place an address is, for where a registry may send the client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AddressKind {
    /// Routable on the internet.
    Public,
    /// 10/8, 172.16/12, 192.168/16, 100.64/10 (shared address space), fc00::/7, fec0::/10.
    Private,
    /// 127/8, ::1.
    Loopback,
    /// 169.254/16 (cloud metadata services live there), fe80::/10.
    LinkLocal,
    /// 0/8, ::, multicast, broadcast: not a host to connect to (0.0.0.0 reaches this machine).
    Unusable,
}

impl AddressKind {
    pub(crate) fn of(addr: IpAddr) -> AddressKind {
        match addr {
            IpAddr::V4(a) => Self::of_v4(a),
            IpAddr::V6(a) => {
                if let Some(v4) = a.to_ipv4_mapped() {
                    return Self::of_v4(v4);
                }
                let s = a.segments();
                // NAT64's well-known prefix 64:ff9b::/96 carries an IPv4 address.
                if s[..6] == [0x64, 0xff9b, 0, 0, 0, 0] {
                    let [a, b] = s[6].to_be_bytes();
                    let [c, d] = s[7].to_be_bytes();
                    return Self::of_v4(Ipv4Addr::new(a, b, c, d));
                }
                if a.is_loopback() {
                    AddressKind::Loopback
                } else if a.is_unspecified() || a.is_multicast() {
                    AddressKind::Unusable
                } else if s[0] & 0xffc0 == 0xfe80 {
                    AddressKind::LinkLocal
                } else if s[0] & 0xfe00 == 0xfc00 || s[0] & 0xffc0 == 0xfec0 {
                    AddressKind::Private
                } else {
                    AddressKind::Public
                }
            }
        }
    }

    fn of_v4(a: Ipv4Addr) -> AddressKind {
        let [x, y, ..] = a.octets();
        if a.is_loopback() {
            AddressKind::Loopback
        } else if a.is_link_local() {
            AddressKind::LinkLocal
        } else if a.is_private() || (x == 100 && (64..128).contains(&y)) {
            AddressKind::Private
        } else if x == 0 || a.is_multicast() || a.is_broadcast() || x >= 240 {
            AddressKind::Unusable
        } else {
            AddressKind::Public
        }
    }

    fn describe(self) -> &'static str {
        match self {
            AddressKind::Public => "a public address",
            AddressKind::Private => "a private address",
            AddressKind::Loopback => "a loopback address",
            AddressKind::LinkLocal => "a link-local address",
            AddressKind::Unusable => "not a unicast host address",
        }
    }
}

/// Why the client may not connect to `target` for a registry at `registry` (its addresses, as
/// resolved; empty when unknown, as through a proxy), or `None` when it may. The registry's own
/// addresses are always allowed. Otherwise a public address is allowed; a private one only when
/// the registry itself is at a private address; a loopback, link-local or unusable one never
/// (a redirect to another loopback address reaches another service of this machine).
pub(crate) fn redirect_refusal(target: IpAddr, registry: &[IpAddr]) -> Option<String> {
    let canon = |a: IpAddr| match a {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(a, IpAddr::V4),
        v4 => v4,
    };
    let target = canon(target);
    if registry.iter().any(|r| canon(*r) == target) {
        return None;
    }
    let kind = AddressKind::of(target);
    let registry_private = registry
        .iter()
        .any(|r| AddressKind::of(*r) == AddressKind::Private);
    let why = match kind {
        AddressKind::Public => return None,
        AddressKind::Private if registry_private => return None,
        AddressKind::Private => format!(
            "{target} is {} and the registry is not on a private network",
            kind.describe()
        ),
        AddressKind::Loopback => format!(
            "{target} is {} other than the registry's own",
            kind.describe()
        ),
        AddressKind::LinkLocal | AddressKind::Unusable => {
            format!("{target} is {}", kind.describe())
        }
    };
    Some(why)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn canon(input: &str) -> Result<String, NameError> {
        RegistryHost::parse(input).map(|h| h.to_string())
    }

    /// Every spelling of one registry gives one name.
    #[test]
    fn spellings_of_one_registry_are_one_name() {
        for (written, want) in [
            ("127.0.0.1:5301", "127.0.0.1:5301"),
            ("127.1:5301", "127.0.0.1:5301"),
            ("127.0.0.01:5301", "127.0.0.1:5301"),
            ("127.0.0.1.:5301", "127.0.0.1:5301"),
            ("[::ffff:127.0.0.1]:5301", "127.0.0.1:5301"),
            ("[::FFFF:7f00:1]:5301", "127.0.0.1:5301"),
            ("2130706433:5301", "127.0.0.1:5301"),
            ("0x7f.1:5301", "127.0.0.1:5301"),
            ("0X7F000001:5301", "127.0.0.1:5301"),
            ("0177.0.0.1:5301", "127.0.0.1:5301"),
            ("127.0.1:5301", "127.0.0.1:5301"),
            ("127.0.0.010", "127.0.0.8"),
            ("LOCALHOST:5301", "localhost:5301"),
            ("localhost.:5301", "localhost:5301"),
            ("EVIL.example.com", "evil.example.com"),
            ("evil.example.com.:443", "evil.example.com"),
            ("A.WILD.EXAMPLE", "a.wild.example"),
            ("a.wild.example:443", "a.wild.example"),
            ("r.io:0443", "r.io"),
            ("r.io:80", "r.io:80"),
            ("[::1]:5000", "[::1]:5000"),
            ("[0:0:0:0:0:0:0:1]:5000", "[::1]:5000"),
            ("[2001:DB8::1]", "[2001:db8::1]"),
            ("index.docker.io", "docker.io"),
            ("Docker.IO:443", "docker.io"),
            ("registry-1.docker.io", "registry-1.docker.io"),
            ("1.2.3.4", "1.2.3.4"),
            ("a-b.c", "a-b.c"),
            ("123abc.example", "123abc.example"),
        ] {
            assert_eq!(canon(written).as_deref(), Ok(want), "{written}");
        }
        // Different registries stay different.
        assert_ne!(canon("localhost:5301"), canon("127.0.0.1:5301"));
        assert_ne!(canon("r.io:8443"), canon("r.io"));
    }

    /// What is not a host and port is refused, with the reason.
    #[test]
    fn malformed_hosts_and_ports_are_refused() {
        for (written, says) in [
            ("", "empty"),
            ("host?x=1", "`?`"),
            ("host#f", "`#`"),
            ("127.0.0.1:5311#x", "port"),
            ("r.io:99999", "out of range"),
            ("r.io:0", "out of range"),
            ("r.io:", "empty"),
            ("r.io:5000:1", "brackets"),
            ("r.io:+5", "port"),
            ("::1", "brackets"),
            ("[::1", "`]`"),
            ("[fe80::1%eth0]", "zone"),
            ("[not-v6]", "IPv6"),
            ("user@r.io", "`@`"),
            ("r.io/x", "`/`"),
            ("r\\io", "`\\`"),
            ("r io", "U+0020"),
            ("ré.io", "U+00E9"),
            ("a..b", "empty label"),
            (".", "empty"),
            ("-r.io", "`-`"),
            ("256.1.1.1", "IPv4"),
            ("1.2.3.4.5", "IPv4"),
            ("999999999999", "IPv4"),
            ("09.1.1.1", "IPv4"),
            ("1.256.1", "IPv4"),
        ] {
            let e = RegistryHost::parse(written).expect_err(written).to_string();
            assert!(e.contains(says), "{written}: {e}");
        }
    }

    #[test]
    fn ipv4_forms_follow_inet_aton() {
        let v4 = |s: &str| match Host::parse(s) {
            Ok(Host::V4(a)) => Some(a.to_string()),
            _ => None,
        };
        assert_eq!(v4("0x7f.0.0.1").as_deref(), Some("127.0.0.1"));
        assert_eq!(v4("10.1").as_deref(), Some("10.0.0.1"));
        assert_eq!(v4("10.1.65535").as_deref(), Some("10.1.255.255"));
        assert_eq!(v4("4294967295").as_deref(), Some("255.255.255.255"));
        assert_eq!(v4("4294967296"), None);
        assert_eq!(v4("0").as_deref(), Some("0.0.0.0"));
        assert_eq!(v4("0x").as_deref(), Some("0.0.0.0"));
        assert_eq!(v4("169.254.169.254.").as_deref(), Some("169.254.169.254"));
        assert_eq!(
            v4("0251.0376.0251.0376").as_deref(),
            Some("169.254.169.254")
        );
    }

    /// The decision on where a registry may send the client, for every range.
    #[test]
    fn redirect_targets_are_judged_by_address() {
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        let on = |reg: &[&str]| reg.iter().map(|s| ip(s)).collect::<Vec<_>>();
        let public = on(&["203.0.113.7"]);
        let loopback = on(&["127.0.0.1"]);
        let private = on(&["10.1.2.3"]);
        for (target, registry, allowed) in [
            // Public: from anywhere.
            ("93.184.216.34", &public, true),
            ("2606:4700::1", &public, true),
            ("93.184.216.34", &loopback, true),
            // Link-local (cloud metadata): never, whoever the registry is.
            ("169.254.169.254", &public, false),
            ("169.254.169.254", &private, false),
            ("169.254.169.254", &loopback, false),
            ("::ffff:169.254.169.254", &public, false),
            ("64:ff9b::a9fe:a9fe", &public, false),
            ("fe80::1", &public, false),
            ("febf::1", &private, false),
            // Loopback: only the registry's own address.
            ("127.0.0.1", &loopback, true),
            ("::ffff:127.0.0.1", &loopback, true),
            ("127.0.0.2", &loopback, false),
            ("127.0.0.1", &public, false),
            ("::1", &public, false),
            ("::1", &loopback, false),
            ("127.0.0.1", &private, false),
            // Private: only when the registry is on a private network.
            ("10.0.0.1", &public, false),
            ("172.16.0.1", &public, false),
            ("172.31.255.255", &public, false),
            ("192.168.1.1", &public, false),
            ("100.64.0.1", &public, false),
            ("100.127.255.255", &public, false),
            ("fc00::1", &public, false),
            ("fd12:3456::1", &public, false),
            ("fec0::1", &public, false),
            ("10.0.0.1", &loopback, false),
            ("10.0.0.1", &private, true),
            ("192.168.1.1", &private, true),
            ("fd12:3456::1", &private, true),
            // Just outside the private ranges: public.
            ("172.32.0.1", &public, true),
            ("100.128.0.1", &public, true),
            ("11.0.0.1", &public, true),
            // Not a host: never.
            ("0.0.0.0", &public, false),
            ("0.1.2.3", &loopback, false),
            ("::", &public, false),
            ("224.0.0.1", &public, false),
            ("255.255.255.255", &public, false),
            ("ff02::1", &public, false),
        ] {
            let why = redirect_refusal(ip(target), registry);
            assert_eq!(
                why.is_none(),
                allowed,
                "{target} from {registry:?}: {why:?}"
            );
            if let Some(why) = why {
                assert!(
                    why.starts_with(&ip(target).to_string()) || why.contains("is "),
                    "{why}"
                );
            }
        }
        // The registry's own address, whatever it is; unknown registry addresses (a proxy):
        // only public targets.
        assert_eq!(
            redirect_refusal(ip("169.254.1.1"), &on(&["169.254.1.1"])),
            None
        );
        assert!(redirect_refusal(ip("127.0.0.1"), &[]).is_some());
        assert!(redirect_refusal(ip("10.0.0.1"), &[]).is_some());
        assert_eq!(redirect_refusal(ip("8.8.8.8"), &[]), None);
    }
}
