//! Adding and removing the VIP, and reading the interface's identity, with iproute2's `ip`.
//!
//! `ip` is the tool every node already has (keepalived's documentation uses it to inspect
//! VIPs); running it costs a few milliseconds per renewal, and keeps the gateway free of a
//! netlink stack. Every invocation has a deadline and is killed if it overruns.

use std::net::IpAddr;
use std::time::Duration;

use tokio::process::Command;

use super::error::AddressError;

/// Deadline of one `ip` invocation: it answers in milliseconds unless the machine is stuck.
pub const IP_COMMAND_TIMEOUT: Duration = Duration::from_secs(2);
/// The `ip` program (iproute2), looked up in `PATH`.
const IP_PROGRAM: &str = "ip";
/// What `ip addr del` says when the address is not there: the kernel's extended ack of newer
/// kernels, or the text of EADDRNOTAVAIL of older ones.
const NOT_PRESENT_MESSAGES: [&str; 2] = ["Address not found", "Cannot assign requested address"];

/// An interface's index and hardware address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InterfaceIdentity {
    /// Kernel interface index.
    pub index: u32,
    /// Ethernet (MAC) address.
    pub mac: [u8; 6],
}

/// The VIP on its interface.
#[derive(Debug, Clone)]
pub struct VipAddress {
    address: IpAddr,
    prefix_len: u8,
    interface: String,
}

impl VipAddress {
    /// `address/prefix_len` on `interface`.
    pub fn new(address: IpAddr, prefix_len: u8, interface: &str) -> Self {
        VipAddress {
            address,
            prefix_len,
            interface: interface.to_string(),
        }
    }

    /// The address.
    pub fn address(&self) -> IpAddr {
        self.address
    }

    /// The interface name.
    pub fn interface(&self) -> &str {
        &self.interface
    }

    fn cidr(&self) -> String {
        format!("{}/{}", self.address, self.prefix_len)
    }

    /// `ip`'s address family flag.
    fn family(&self) -> &'static str {
        if self.address.is_ipv4() {
            "-4"
        } else {
            "-6"
        }
    }

    /// Adds the address, or renews it, valid (and preferred) for `lifetime_seconds`: the
    /// kernel removes it by itself when the lifetime ends (see `super::fence`). An IPv6 VIP is
    /// added with `nodad`: duplicate address detection would hold it *tentative* (unusable)
    /// for a second, and the election, not DAD, keeps it unique.
    pub async fn hold(&self, lifetime_seconds: u32) -> Result<(), AddressError> {
        let lifetime = lifetime_seconds.to_string();
        let cidr = self.cidr();
        let mut args = vec![
            self.family(),
            "addr",
            "replace",
            &cidr,
            "dev",
            &self.interface,
            "valid_lft",
            &lifetime,
            "preferred_lft",
            &lifetime,
        ];
        if self.address.is_ipv6() {
            args.push("nodad");
        }
        run_ip(&args).await.map(drop)
    }

    /// Removes the address; `Ok(false)` when it was not there.
    pub async fn release(&self) -> Result<bool, AddressError> {
        let cidr = self.cidr();
        let args = [self.family(), "addr", "del", &cidr, "dev", &self.interface];
        match run_ip(&args).await {
            Ok(_) => Ok(true),
            Err(AddressError::Failed { stderr, .. })
                if NOT_PRESENT_MESSAGES
                    .iter()
                    .any(|message| stderr.contains(message)) =>
            {
                Ok(false)
            }
            Err(error) => Err(error),
        }
    }

    /// The interface's index and MAC address (for the announcements).
    pub async fn interface_identity(&self) -> Result<InterfaceIdentity, AddressError> {
        let output = run_ip(&["-o", "link", "show", "dev", &self.interface]).await?;
        parse_link_line(&output).ok_or_else(|| AddressError::UnexpectedOutput {
            interface: self.interface.clone(),
            output,
        })
    }
}

/// Parses `ip -o link show dev X`: `2: eth0@if5: <...> ... link/ether aa:bb:cc:dd:ee:ff brd ...`.
pub fn parse_link_line(line: &str) -> Option<InterfaceIdentity> {
    let index = line.split(':').next()?.trim().parse().ok()?;
    let mut words = line.split_whitespace();
    words.find(|word| *word == "link/ether")?;
    let mac_text = words.next()?;
    let mut mac = [0u8; 6];
    let mut parts = mac_text.split(':');
    for byte in &mut mac {
        *byte = u8::from_str_radix(parts.next()?, 16).ok()?;
    }
    parts
        .next()
        .is_none()
        .then_some(InterfaceIdentity { index, mac })
}

/// Runs `ip ARGS` with [`IP_COMMAND_TIMEOUT`]; returns its standard output.
async fn run_ip(args: &[&str]) -> Result<String, AddressError> {
    let command_line = format!("{IP_PROGRAM} {}", args.join(" "));
    let output = Command::new(IP_PROGRAM)
        .args(args)
        .kill_on_drop(true)
        .output();
    let output = tokio::time::timeout(IP_COMMAND_TIMEOUT, output)
        .await
        .map_err(|_| AddressError::Timeout {
            command: command_line.clone(),
            timeout: IP_COMMAND_TIMEOUT,
        })?
        .map_err(|source| AddressError::Spawn {
            command: command_line.clone(),
            source,
        })?;
    if output.status.success() {
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    } else {
        Err(AddressError::Failed {
            command: command_line,
            status: output.status,
            stderr: String::from_utf8_lossy(&output.stderr).trim().to_string(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn link_lines() {
        let line =
            "2: eth0@if5: <BROADCAST,MULTICAST,UP,LOWER_UP> mtu 1500 qdisc noqueue state UP \
                    mode DEFAULT group default qlen 1000\\    link/ether 9a:0b:1c:2d:3e:4f brd \
                    ff:ff:ff:ff:ff:ff link-netns hub";
        assert_eq!(
            parse_link_line(line),
            Some(InterfaceIdentity {
                index: 2,
                mac: [0x9a, 0x0b, 0x1c, 0x2d, 0x3e, 0x4f]
            })
        );
        assert_eq!(
            parse_link_line("1: lo: <LOOPBACK> link/loopback 00:00:00:00:00:00"),
            None
        );
        assert_eq!(
            parse_link_line("x: eth0: link/ether 9a:0b:1c:2d:3e:4f"),
            None
        );
        assert_eq!(parse_link_line("3: eth0: link/ether 9a:0b:1c:2d:3e"), None);
    }
}
