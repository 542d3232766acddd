//! `etcdserverpb.Auth`: users, roles, permissions, the auth switch and
//! Authenticate.
//!
//! Changes go through Raft as [`AuthCommand`]s, checked for root when
//! applied. Passwords are hashed (bcrypt, `--bcrypt-cost`) by the member
//! that receives the request, so the log never holds a plain password.
//! Reads (AuthStatus, UserGet, UserList, RoleGet, RoleList) pass the read
//! barrier and answer from the member's applied state: root may read
//! everything, a user may read itself and the roles it holds.
//!
//! Authenticate follows etcd: check the password against the applied state,
//! propose an Authenticate command (which registers the simple token on
//! every member), and start over if the auth revision moved in between, so
//! a token is never issued against a password that just changed.

use std::sync::Arc;

use etcd_proto::authpb;
use etcd_proto::etcdserverpb::auth_server::Auth;
use etcd_proto::etcdserverpb::*;
use tonic::{Request, Response, Status};

use crate::auth::perm::Permission;
use crate::auth::state::{AuthInfo, AuthState};
use crate::auth::token::random_prefix;
use crate::auth::{AuthCommand, TokenProvider};
use crate::errors::EtcdError;
use crate::server::core::status::{hash_failed, task_failed};
use crate::server::core::Core;

/// Times Authenticate starts over when the auth revision moves between the
/// password check and the token's commit.
const AUTHENTICATE_ATTEMPTS: usize = 8;

/// Serves the Auth API of one member.
pub struct AuthService {
    core: Arc<Core>,
}

/// bcrypt, off the async threads (a hash costs tens of milliseconds), in
/// the `$2a$` form Go's bcrypt writes.
async fn hash_password(password: String, cost: u32) -> Result<String, Status> {
    let hashed = tokio::task::spawn_blocking(move || {
        bcrypt::hash_with_result(password, cost)
            .map(|h| h.format_for_version(bcrypt::Version::TwoA))
    })
    .await
    .map_err(task_failed)?;
    hashed.map_err(hash_failed)
}

async fn password_matches(password: String, hash: String) -> Result<bool, Status> {
    tokio::task::spawn_blocking(move || bcrypt::verify(password, &hash).unwrap_or(false))
        .await
        .map_err(task_failed)
}

fn permission_from_wire(p: authpb::Permission) -> Permission {
    Permission {
        kind: p.perm_type,
        key: p.key,
        range_end: p.range_end,
    }
}

fn permission_to_wire(p: &Permission) -> authpb::Permission {
    authpb::Permission {
        perm_type: p.kind,
        key: p.key.clone(),
        range_end: p.range_end.clone(),
    }
}

impl AuthService {
    /// A service over `core`.
    pub fn new(core: Arc<Core>) -> Self {
        Self { core }
    }

    fn header(&self) -> Option<ResponseHeader> {
        self.core.current_header()
    }

    /// Proposes `cmd` on behalf of `req`'s caller; answers the header.
    async fn change<T>(
        &self,
        req: &Request<T>,
        cmd: AuthCommand,
    ) -> Result<Option<ResponseHeader>, Status> {
        let by = self.core.caller(req).await?;
        self.core.auth(Some(by), cmd).await?;
        Ok(self.header())
    }

    /// Passes the read barrier and returns `req`'s caller and the state.
    async fn read<T>(&self, req: &Request<T>) -> Result<(AuthInfo, AuthState), Status> {
        self.core.read_barrier().await?;
        let info = self.core.caller(req).await?;
        let state = self.core.auth.state().clone();
        Ok((info, state))
    }

    async fn new_password_hash(
        &self,
        password: String,
        client_hash: String,
    ) -> Result<String, Status> {
        if !client_hash.is_empty() {
            return Ok(client_hash);
        }
        hash_password(password, self.core.auth.bcrypt_cost).await
    }

    /// One Authenticate attempt: None if the auth revision moved.
    async fn try_authenticate(&self, name: &str, password: &str) -> Result<Option<String>, Status> {
        let (checked, hash) = {
            let state = self.core.auth.state();
            if !state.enabled {
                return Err(EtcdError::AuthNotEnabled.into());
            }
            let user = state.users.get(name).ok_or(EtcdError::AuthFailed)?;
            if user.no_password {
                return Err(EtcdError::NoPasswordUser.into());
            }
            (state.revision, user.password_hash.clone())
        };
        if !password_matches(password.to_string(), hash).await? {
            return Err(EtcdError::AuthFailed.into());
        }
        let cmd = AuthCommand::Authenticate {
            name: name.to_string(),
            token_prefix: random_prefix(),
        };
        let (simple_token, revision) = self.core.authenticate(cmd).await?;
        if revision != checked {
            return Ok(None);
        }
        match (simple_token, &self.core.auth.tokens) {
            (Some(token), _) => Ok(Some(token)),
            (None, TokenProvider::Jwt(jwt)) => Ok(Some(jwt.sign(name, revision)?)),
            // The leader issued no simple token: it runs JWT while this
            // member runs simple tokens (members configured differently).
            (None, TokenProvider::Simple(_)) => {
                tracing::error!(
                    "the leader issued no simple token: --auth-token differs between members"
                );
                Err(EtcdError::AuthFailed.into())
            }
        }
    }
}

#[tonic::async_trait]
impl Auth for AuthService {
    async fn auth_enable(
        &self,
        req: Request<AuthEnableRequest>,
    ) -> Result<Response<AuthEnableResponse>, Status> {
        let header = self.change(&req, AuthCommand::Enable).await?;
        Ok(Response::new(AuthEnableResponse { header }))
    }

    async fn auth_disable(
        &self,
        req: Request<AuthDisableRequest>,
    ) -> Result<Response<AuthDisableResponse>, Status> {
        let header = self.change(&req, AuthCommand::Disable).await?;
        Ok(Response::new(AuthDisableResponse { header }))
    }

    async fn auth_status(
        &self,
        req: Request<AuthStatusRequest>,
    ) -> Result<Response<AuthStatusResponse>, Status> {
        let (info, state) = self.read(&req).await?;
        state.check_admin(&info)?;
        Ok(Response::new(AuthStatusResponse {
            header: self.header(),
            enabled: state.enabled,
            auth_revision: state.revision,
        }))
    }

    async fn authenticate(
        &self,
        req: Request<AuthenticateRequest>,
    ) -> Result<Response<AuthenticateResponse>, Status> {
        self.core.read_barrier().await?;
        let AuthenticateRequest { name, password } = req.into_inner();
        for _ in 0..AUTHENTICATE_ATTEMPTS {
            if let Some(token) = self.try_authenticate(&name, &password).await? {
                return Ok(Response::new(AuthenticateResponse {
                    header: self.header(),
                    token,
                }));
            }
            tracing::info!(user = %name, "auth revision moved during authentication; retrying");
        }
        Err(EtcdError::Timeout.into())
    }

    async fn user_add(
        &self,
        req: Request<AuthUserAddRequest>,
    ) -> Result<Response<AuthUserAddResponse>, Status> {
        let r = req.get_ref().clone();
        if r.name.is_empty() {
            return Err(EtcdError::UserEmpty.into());
        }
        let no_password = r.options.is_some_and(|o| o.no_password);
        let password_hash = if no_password {
            String::new()
        } else {
            self.new_password_hash(r.password, r.hashed_password)
                .await?
        };
        let cmd = AuthCommand::UserAdd {
            name: r.name,
            password_hash,
            no_password,
        };
        let header = self.change(&req, cmd).await?;
        Ok(Response::new(AuthUserAddResponse { header }))
    }

    async fn user_get(
        &self,
        req: Request<AuthUserGetRequest>,
    ) -> Result<Response<AuthUserGetResponse>, Status> {
        let (info, state) = self.read(&req).await?;
        let name = &req.get_ref().name;
        if let Err(e) = state.check_admin(&info) {
            if *name != info.username {
                return Err(e.into());
            }
        }
        let user = state.users.get(name).ok_or(EtcdError::UserNotFound)?;
        Ok(Response::new(AuthUserGetResponse {
            header: self.header(),
            roles: user.roles.clone(),
        }))
    }

    async fn user_list(
        &self,
        req: Request<AuthUserListRequest>,
    ) -> Result<Response<AuthUserListResponse>, Status> {
        let (info, state) = self.read(&req).await?;
        state.check_admin(&info)?;
        Ok(Response::new(AuthUserListResponse {
            header: self.header(),
            users: state.users.keys().cloned().collect(),
        }))
    }

    async fn user_delete(
        &self,
        req: Request<AuthUserDeleteRequest>,
    ) -> Result<Response<AuthUserDeleteResponse>, Status> {
        let cmd = AuthCommand::UserDelete(req.get_ref().name.clone());
        let header = self.change(&req, cmd).await?;
        Ok(Response::new(AuthUserDeleteResponse { header }))
    }

    async fn user_change_password(
        &self,
        req: Request<AuthUserChangePasswordRequest>,
    ) -> Result<Response<AuthUserChangePasswordResponse>, Status> {
        let r = req.get_ref().clone();
        let password_hash = self
            .new_password_hash(r.password, r.hashed_password)
            .await?;
        let cmd = AuthCommand::UserChangePassword {
            name: r.name,
            password_hash,
        };
        let header = self.change(&req, cmd).await?;
        Ok(Response::new(AuthUserChangePasswordResponse { header }))
    }

    async fn user_grant_role(
        &self,
        req: Request<AuthUserGrantRoleRequest>,
    ) -> Result<Response<AuthUserGrantRoleResponse>, Status> {
        let r = req.get_ref();
        let cmd = AuthCommand::UserGrantRole {
            user: r.user.clone(),
            role: r.role.clone(),
        };
        let header = self.change(&req, cmd).await?;
        Ok(Response::new(AuthUserGrantRoleResponse { header }))
    }

    async fn user_revoke_role(
        &self,
        req: Request<AuthUserRevokeRoleRequest>,
    ) -> Result<Response<AuthUserRevokeRoleResponse>, Status> {
        let r = req.get_ref();
        let cmd = AuthCommand::UserRevokeRole {
            user: r.name.clone(),
            role: r.role.clone(),
        };
        let header = self.change(&req, cmd).await?;
        Ok(Response::new(AuthUserRevokeRoleResponse { header }))
    }

    async fn role_add(
        &self,
        req: Request<AuthRoleAddRequest>,
    ) -> Result<Response<AuthRoleAddResponse>, Status> {
        let cmd = AuthCommand::RoleAdd(req.get_ref().name.clone());
        let header = self.change(&req, cmd).await?;
        Ok(Response::new(AuthRoleAddResponse { header }))
    }

    async fn role_get(
        &self,
        req: Request<AuthRoleGetRequest>,
    ) -> Result<Response<AuthRoleGetResponse>, Status> {
        let (info, state) = self.read(&req).await?;
        let name = &req.get_ref().role;
        if let Err(e) = state.check_admin(&info) {
            if !state.has_role(&info.username, name) {
                return Err(e.into());
            }
        }
        let role = state.roles.get(name).ok_or(EtcdError::RoleNotFound)?;
        Ok(Response::new(AuthRoleGetResponse {
            header: self.header(),
            perm: role.perms.iter().map(permission_to_wire).collect(),
        }))
    }

    async fn role_list(
        &self,
        req: Request<AuthRoleListRequest>,
    ) -> Result<Response<AuthRoleListResponse>, Status> {
        let (info, state) = self.read(&req).await?;
        state.check_admin(&info)?;
        Ok(Response::new(AuthRoleListResponse {
            header: self.header(),
            roles: state.roles.keys().cloned().collect(),
        }))
    }

    async fn role_delete(
        &self,
        req: Request<AuthRoleDeleteRequest>,
    ) -> Result<Response<AuthRoleDeleteResponse>, Status> {
        let cmd = AuthCommand::RoleDelete(req.get_ref().role.clone());
        let header = self.change(&req, cmd).await?;
        Ok(Response::new(AuthRoleDeleteResponse { header }))
    }

    async fn role_grant_permission(
        &self,
        req: Request<AuthRoleGrantPermissionRequest>,
    ) -> Result<Response<AuthRoleGrantPermissionResponse>, Status> {
        let r = req.get_ref().clone();
        let cmd = AuthCommand::RoleGrantPermission {
            role: r.name,
            perm: r.perm.map(permission_from_wire),
        };
        let header = self.change(&req, cmd).await?;
        Ok(Response::new(AuthRoleGrantPermissionResponse { header }))
    }

    async fn role_revoke_permission(
        &self,
        req: Request<AuthRoleRevokePermissionRequest>,
    ) -> Result<Response<AuthRoleRevokePermissionResponse>, Status> {
        let r = req.get_ref().clone();
        let cmd = AuthCommand::RoleRevokePermission {
            role: r.role,
            key: r.key,
            range_end: r.range_end,
        };
        let header = self.change(&req, cmd).await?;
        Ok(Response::new(AuthRoleRevokePermissionResponse { header }))
    }
}
