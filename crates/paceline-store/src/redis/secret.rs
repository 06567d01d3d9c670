//! The store's token keys, kept in Redis so that every process sharing it signs alike.

use paceline_core::{StoreError, StoreErrorKind};

use super::RedisStore;
use crate::secret::{from_hex, random_secret, to_hex, TokenKey, SECRET_LEN};
use crate::Error;

impl RedisStore {
    /// The key that signs tokens of kind `name`, kept in Redis at `PREFIX:v2:secret:NAME`
    /// (64 hex digits): the first process to ask draws it (`SET ... NX GET`, one round
    /// trip), every later one reads it. Deleting that Redis key makes every token signed
    /// with it invalid once the processes sharing it are restarted; until then each keeps
    /// the key it read.
    pub async fn token_key(&self, name: &str) -> Result<TokenKey, Error> {
        let key = format!("{}secret:{name}", self.key_prefix());
        let fresh = to_hex(&random_secret()?);
        let mut set = redis::cmd("SET");
        set.arg(&key).arg(&fresh).arg("NX").arg("GET");
        let kept: Option<String> = self.transport().query(&set, "a token key").await?;
        let text = kept.unwrap_or(fresh);
        let mut secret = [0u8; SECRET_LEN];
        if !from_hex(&text, &mut secret) {
            return Err(Error::Store(StoreError::new(
                StoreErrorKind::Protocol,
                format!(
                    "Redis key `{key}` is not 64 hex digits, so it cannot sign tokens; delete \
                     it and a new one is drawn"
                ),
            )));
        }
        Ok(TokenKey::new(&secret))
    }
}
