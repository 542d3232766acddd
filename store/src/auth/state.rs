//! The replicated auth state: users, roles, the enabled flag and the auth
//! revision, with etcd's rules for changing them and for checking requests.
//!
//! Every change arrives as an [`AuthCommand`] through Raft and is applied by
//! [`AuthState::apply`], a pure function of the state, so all members agree.
//! The auth revision counts changes exactly as etcd 3.5 does (observed with
//! `etcdctl auth status`): every successful user/role change bumps it,
//! including a repeated permission grant, but granting a role a user already
//! has does not, enabling auth does not, and disabling bumps only if auth
//! was enabled. A request carries the revision its credentials were checked
//! at; one older than the store's is refused (`AuthOldRevision`) and the
//! client re-authenticates.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::perm::{self, Access, Permission};
use crate::errors::EtcdError;

/// etcd's superuser and superrole name.
pub const ROOT: &str = "root";

/// Who sent a request, as far as auth is concerned: the user name and the
/// auth revision at which its token (or certificate) was checked. Revision 0
/// means "no credentials".
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuthInfo {
    /// The user ("" when the request carried no credentials).
    pub username: String,
    /// The auth revision the credentials were checked at.
    pub revision: u64,
}

/// A user.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct User {
    /// bcrypt hash (empty for a user added with `--no-password`).
    pub password_hash: String,
    /// Authenticates by certificate only.
    pub no_password: bool,
    /// Granted roles, sorted.
    pub roles: Vec<String>,
}

/// A role: its key permissions, sorted by key.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Role {
    /// Granted permissions.
    pub perms: Vec<Permission>,
}

/// A change to the auth state (the Raft command).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum AuthCommand {
    /// AuthEnable.
    Enable,
    /// AuthDisable.
    Disable,
    /// UserAdd, with the password already hashed by the proposing member.
    UserAdd {
        /// User name.
        name: String,
        /// bcrypt hash.
        password_hash: String,
        /// `--no-password`.
        no_password: bool,
    },
    /// UserDelete.
    UserDelete(String),
    /// UserChangePassword, hashed.
    UserChangePassword {
        /// User name.
        name: String,
        /// bcrypt hash.
        password_hash: String,
    },
    /// UserGrantRole.
    UserGrantRole {
        /// User name.
        user: String,
        /// Role name.
        role: String,
    },
    /// UserRevokeRole.
    UserRevokeRole {
        /// User name.
        user: String,
        /// Role name.
        role: String,
    },
    /// RoleAdd.
    RoleAdd(String),
    /// RoleDelete.
    RoleDelete(String),
    /// RoleGrantPermission (`None`: no permission given).
    RoleGrantPermission {
        /// Role name.
        role: String,
        /// The permission.
        perm: Option<Permission>,
    },
    /// RoleRevokePermission.
    RoleRevokePermission {
        /// Role name.
        role: String,
        /// Key of the permission.
        key: Vec<u8>,
        /// Range end of the permission.
        range_end: Vec<u8>,
    },
    /// Authenticate, after the proposing member checked the password:
    /// registers a simple token `<prefix>.<log index>` on every member.
    Authenticate {
        /// User name.
        name: String,
        /// Random token prefix chosen by the proposing member.
        token_prefix: String,
    },
}

impl AuthCommand {
    /// True for commands only root may run once auth is enabled.
    fn needs_admin(&self) -> bool {
        !matches!(self, AuthCommand::Authenticate { .. })
    }
}

/// What applying an [`AuthCommand`] did besides changing the state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Applied {
    /// Nothing else.
    Done,
    /// A user's password changed or the user is gone: drop its tokens.
    InvalidateUser(String),
    /// Auth was disabled: drop every token.
    DropAllTokens,
    /// Authentication accepted for this user at this auth revision.
    Authenticated {
        /// The user.
        name: String,
        /// The auth revision.
        revision: u64,
    },
}

/// The whole auth state of a member.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuthState {
    /// AuthEnable was applied (and no AuthDisable since).
    pub enabled: bool,
    /// etcd's auth revision; starts at 1.
    pub revision: u64,
    /// Users by name.
    pub users: BTreeMap<String, User>,
    /// Roles by name.
    pub roles: BTreeMap<String, Role>,
}

impl Default for AuthState {
    fn default() -> Self {
        Self {
            enabled: false,
            revision: 1,
            users: BTreeMap::new(),
            roles: BTreeMap::new(),
        }
    }
}

impl AuthState {
    fn user(&self, name: &str) -> Result<&User, EtcdError> {
        self.users.get(name).ok_or(EtcdError::UserNotFound)
    }

    fn user_mut(&mut self, name: &str) -> Result<&mut User, EtcdError> {
        self.users.get_mut(name).ok_or(EtcdError::UserNotFound)
    }

    fn role_mut(&mut self, name: &str) -> Result<&mut Role, EtcdError> {
        self.roles.get_mut(name).ok_or(EtcdError::RoleNotFound)
    }

    /// True if `user` has the root role.
    pub fn is_root(user: &User) -> bool {
        user.roles.iter().any(|r| r == ROOT)
    }

    /// etcd's `IsAdminPermitted`: anyone while auth is disabled, else only
    /// a user holding the root role.
    pub fn check_admin(&self, info: &AuthInfo) -> Result<(), EtcdError> {
        if !self.enabled {
            return Ok(());
        }
        if info.username.is_empty() {
            return Err(EtcdError::UserEmpty);
        }
        let user = self.user(&info.username)?;
        if !Self::is_root(user) {
            return Err(EtcdError::PermissionDenied);
        }
        Ok(())
    }

    /// etcd's `isOpPermitted`: may `info` access `[key, range_end)`?
    pub fn check_keys(
        &self,
        info: &AuthInfo,
        access: Access,
        key: &[u8],
        range_end: &[u8],
    ) -> Result<(), EtcdError> {
        // Observed on etcd 3.5.1: credentials from an older auth revision
        // (a JWT issued before `auth disable`) are refused even while auth
        // is disabled.
        if info.revision != 0 && info.revision < self.revision {
            return Err(EtcdError::AuthOldRevision);
        }
        if !self.enabled {
            return Ok(());
        }
        if info.revision == 0 {
            return Err(EtcdError::UserEmpty);
        }
        let user = self
            .users
            .get(&info.username)
            .ok_or(EtcdError::PermissionDenied)?;
        if Self::is_root(user) {
            return Ok(());
        }
        let granted = user
            .roles
            .iter()
            .filter_map(|r| self.roles.get(r))
            .flat_map(|r| r.perms.iter());
        if perm::covers(granted, access, key, range_end) {
            Ok(())
        } else {
            Err(EtcdError::PermissionDenied)
        }
    }

    /// True if the user holds `role` (UserGet/RoleGet of one's own).
    pub fn has_role(&self, user: &str, role: &str) -> bool {
        self.users
            .get(user)
            .is_some_and(|u| u.roles.iter().any(|r| r == role))
    }

    /// Applies `cmd` sent by `by`. On error nothing changed.
    pub fn apply(
        &mut self,
        cmd: &AuthCommand,
        by: Option<&AuthInfo>,
    ) -> Result<Applied, EtcdError> {
        if cmd.needs_admin() {
            if let Some(info) = by {
                self.check_admin(info)?;
            }
        }
        let before = self.revision;
        let applied = self.apply_change(cmd)?;
        debug_assert!(self.revision >= before, "auth revision went back");
        Ok(applied)
    }

    fn bump(&mut self) {
        self.revision += 1;
    }

    fn apply_change(&mut self, cmd: &AuthCommand) -> Result<Applied, EtcdError> {
        match cmd {
            AuthCommand::Enable => self.enable(),
            AuthCommand::Disable => {
                if self.enabled {
                    self.enabled = false;
                    self.bump();
                }
                Ok(Applied::DropAllTokens)
            }
            AuthCommand::UserAdd {
                name,
                password_hash,
                no_password,
            } => {
                if name.is_empty() {
                    return Err(EtcdError::UserEmpty);
                }
                if self.users.contains_key(name) {
                    return Err(EtcdError::UserAlreadyExist);
                }
                let user = User {
                    password_hash: password_hash.clone(),
                    no_password: *no_password,
                    roles: Vec::new(),
                };
                self.users.insert(name.clone(), user);
                self.bump();
                Ok(Applied::Done)
            }
            AuthCommand::UserDelete(name) => {
                if self.enabled && name == ROOT {
                    return Err(EtcdError::InvalidAuthMgmt);
                }
                self.users.remove(name).ok_or(EtcdError::UserNotFound)?;
                self.bump();
                Ok(Applied::InvalidateUser(name.clone()))
            }
            AuthCommand::UserChangePassword {
                name,
                password_hash,
            } => {
                self.user_mut(name)?.password_hash = password_hash.clone();
                self.bump();
                Ok(Applied::InvalidateUser(name.clone()))
            }
            AuthCommand::UserGrantRole { user, role } => self.grant_role(user, role),
            AuthCommand::UserRevokeRole { user, role } => {
                if self.enabled && user == ROOT && role == ROOT {
                    return Err(EtcdError::InvalidAuthMgmt);
                }
                let u = self.user_mut(user)?;
                let at = u
                    .roles
                    .iter()
                    .position(|r| r == role)
                    .ok_or(EtcdError::RoleNotGranted)?;
                u.roles.remove(at);
                self.bump();
                Ok(Applied::Done)
            }
            AuthCommand::RoleAdd(name) => {
                if name.is_empty() {
                    return Err(EtcdError::RoleEmpty);
                }
                if self.roles.contains_key(name) {
                    return Err(EtcdError::RoleAlreadyExist);
                }
                self.roles.insert(name.clone(), Role::default());
                self.bump();
                Ok(Applied::Done)
            }
            AuthCommand::RoleDelete(name) => {
                if self.enabled && name == ROOT {
                    return Err(EtcdError::InvalidAuthMgmt);
                }
                self.roles.remove(name).ok_or(EtcdError::RoleNotFound)?;
                for user in self.users.values_mut() {
                    user.roles.retain(|r| r != name);
                }
                self.bump();
                Ok(Applied::Done)
            }
            AuthCommand::RoleGrantPermission { role, perm } => {
                // etcd checks the permission before it looks up the role.
                let perm = perm.as_ref().ok_or(EtcdError::PermissionNotGiven)?;
                let r = self.role_mut(role)?;
                match r
                    .perms
                    .iter_mut()
                    .find(|p| p.key == perm.key && p.range_end == perm.range_end)
                {
                    Some(existing) => existing.kind = perm.kind,
                    None => {
                        r.perms.push(perm.clone());
                        r.perms
                            .sort_by(|a, b| (&a.key, &a.range_end).cmp(&(&b.key, &b.range_end)));
                    }
                }
                self.bump();
                Ok(Applied::Done)
            }
            AuthCommand::RoleRevokePermission {
                role,
                key,
                range_end,
            } => {
                let r = self.role_mut(role)?;
                let at = r
                    .perms
                    .iter()
                    .position(|p| &p.key == key && &p.range_end == range_end)
                    .ok_or(EtcdError::PermissionNotGranted)?;
                r.perms.remove(at);
                self.bump();
                Ok(Applied::Done)
            }
            AuthCommand::Authenticate { name, .. } => {
                if !self.enabled {
                    return Err(EtcdError::AuthNotEnabled);
                }
                if !self.users.contains_key(name) {
                    return Err(EtcdError::AuthFailed);
                }
                Ok(Applied::Authenticated {
                    name: name.clone(),
                    revision: self.revision,
                })
            }
        }
    }

    fn enable(&mut self) -> Result<Applied, EtcdError> {
        if self.enabled {
            return Ok(Applied::Done);
        }
        let root = self.users.get(ROOT).ok_or(EtcdError::RootUserNotExist)?;
        if !Self::is_root(root) {
            return Err(EtcdError::RootRoleNotExist);
        }
        self.enabled = true;
        Ok(Applied::Done)
    }

    fn grant_role(&mut self, user: &str, role: &str) -> Result<Applied, EtcdError> {
        // The root role may be granted before it exists, as in etcd.
        if role != ROOT && !self.roles.contains_key(role) {
            self.user(user)?;
            return Err(EtcdError::RoleNotFound);
        }
        let u = self.user_mut(user)?;
        if let Err(at) = u.roles.binary_search_by(|r| r.as_str().cmp(role)) {
            u.roles.insert(at, role.to_string());
            self.bump();
        }
        Ok(Applied::Done)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use etcd_proto::authpb::permission::Type as PermType;

    fn add_user(s: &mut AuthState, name: &str) {
        let cmd = AuthCommand::UserAdd {
            name: name.into(),
            password_hash: String::new(),
            no_password: false,
        };
        s.apply(&cmd, None).unwrap();
    }

    fn grant(s: &mut AuthState, user: &str, role: &str) -> Result<Applied, EtcdError> {
        let cmd = AuthCommand::UserGrantRole {
            user: user.into(),
            role: role.into(),
        };
        s.apply(&cmd, None)
    }

    fn enabled_with_alice() -> AuthState {
        let mut s = AuthState::default();
        add_user(&mut s, ROOT);
        add_user(&mut s, "alice");
        grant(&mut s, ROOT, ROOT).unwrap();
        s.apply(&AuthCommand::RoleAdd("r".into()), None).unwrap();
        let perm = Permission {
            kind: PermType::Readwrite as i32,
            key: b"a/".to_vec(),
            range_end: b"a0".to_vec(),
        };
        let cmd = AuthCommand::RoleGrantPermission {
            role: "r".into(),
            perm: Some(perm),
        };
        s.apply(&cmd, None).unwrap();
        grant(&mut s, "alice", "r").unwrap();
        s.apply(&AuthCommand::Enable, None).unwrap();
        s
    }

    #[test]
    fn revision_counts_changes_like_etcd() {
        let mut s = AuthState::default();
        assert_eq!(s.revision, 1);
        add_user(&mut s, ROOT);
        assert_eq!(s.revision, 2);
        assert_eq!(
            s.apply(&AuthCommand::Enable, None),
            Err(EtcdError::RootRoleNotExist)
        );
        grant(&mut s, ROOT, ROOT).unwrap();
        assert_eq!(s.revision, 3);
        grant(&mut s, ROOT, ROOT).unwrap();
        assert_eq!(s.revision, 3, "a repeated role grant changes nothing");
        s.apply(&AuthCommand::Enable, None).unwrap();
        assert!(s.enabled);
        assert_eq!(s.revision, 3, "enabling does not bump");
        s.apply(&AuthCommand::Disable, None).unwrap();
        assert_eq!(s.revision, 4);
        s.apply(&AuthCommand::Disable, None).unwrap();
        assert_eq!(s.revision, 4, "disabling twice bumps once");
    }

    #[test]
    fn a_grant_without_a_permission_is_refused_before_the_role_is_looked_up() {
        // etcd 3.5.1 answers "permission not given" even for a role that
        // does not exist (found by raw_grpc_differential, seed 2).
        let mut s = AuthState::default();
        let cmd = AuthCommand::RoleGrantPermission {
            role: "nobody".into(),
            perm: None,
        };
        assert_eq!(s.apply(&cmd, None), Err(EtcdError::PermissionNotGiven));
    }

    #[test]
    fn enabling_needs_root_with_the_root_role() {
        let mut s = AuthState::default();
        assert_eq!(
            s.apply(&AuthCommand::Enable, None),
            Err(EtcdError::RootUserNotExist)
        );
    }

    #[test]
    fn root_is_protected_while_enabled() {
        let mut s = enabled_with_alice();
        let root = AuthInfo {
            username: ROOT.into(),
            revision: s.revision,
        };
        let cases = [
            AuthCommand::UserDelete(ROOT.into()),
            AuthCommand::RoleDelete(ROOT.into()),
            AuthCommand::UserRevokeRole {
                user: ROOT.into(),
                role: ROOT.into(),
            },
        ];
        for cmd in cases {
            assert_eq!(s.apply(&cmd, Some(&root)), Err(EtcdError::InvalidAuthMgmt));
        }
    }

    #[test]
    fn management_needs_root_once_enabled() {
        let mut s = enabled_with_alice();
        let alice = AuthInfo {
            username: "alice".into(),
            revision: s.revision,
        };
        let cmd = AuthCommand::RoleAdd("x".into());
        assert_eq!(
            s.apply(&cmd, Some(&alice)),
            Err(EtcdError::PermissionDenied)
        );
        assert_eq!(
            s.apply(&cmd, Some(&AuthInfo::default())),
            Err(EtcdError::UserEmpty)
        );
        let root = AuthInfo {
            username: ROOT.into(),
            revision: s.revision,
        };
        assert!(s.apply(&cmd, Some(&root)).is_ok());
    }

    #[test]
    fn key_checks_follow_roles_and_revisions() {
        let s = enabled_with_alice();
        let alice = AuthInfo {
            username: "alice".into(),
            revision: s.revision,
        };
        assert_eq!(s.check_keys(&alice, Access::Write, b"a/1", b""), Ok(()));
        assert_eq!(
            s.check_keys(&alice, Access::Read, b"b", b""),
            Err(EtcdError::PermissionDenied)
        );
        assert_eq!(
            s.check_keys(&AuthInfo::default(), Access::Read, b"a/1", b""),
            Err(EtcdError::UserEmpty)
        );
        let stale = AuthInfo {
            revision: s.revision - 1,
            ..alice
        };
        assert_eq!(
            s.check_keys(&stale, Access::Read, b"a/1", b""),
            Err(EtcdError::AuthOldRevision)
        );
        let root = AuthInfo {
            username: ROOT.into(),
            revision: s.revision,
        };
        assert_eq!(s.check_keys(&root, Access::Write, b"zzz", b"\0"), Ok(()));
    }

    #[test]
    fn stale_credentials_are_refused_even_after_disable() {
        let mut s = enabled_with_alice();
        let alice = AuthInfo {
            username: "alice".into(),
            revision: s.revision,
        };
        s.apply(&AuthCommand::Disable, None).unwrap();
        assert_eq!(
            s.check_keys(&alice, Access::Read, b"zzz", b""),
            Err(EtcdError::AuthOldRevision)
        );
        assert_eq!(
            s.check_keys(&AuthInfo::default(), Access::Read, b"zzz", b""),
            Ok(())
        );
    }

    #[test]
    fn deleting_a_role_revokes_it_from_users() {
        let mut s = enabled_with_alice();
        let root = AuthInfo {
            username: ROOT.into(),
            revision: s.revision,
        };
        s.apply(&AuthCommand::RoleDelete("r".into()), Some(&root))
            .unwrap();
        assert!(!s.has_role("alice", "r"));
    }
}
