// crates/paceline/examples/discord_bot.rs
// Gives a role to members of a Discord server, as fast as Discord's limits allow:
// DISCORD_TOKEN=... cargo run -p paceline --example discord_bot -F reqwest -- GUILD ROLE MEMBER...
use paceline::client::headers::Discord;
use paceline::client::middleware::Limited;
use paceline::client::{Client, ClientConfig};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let token =
        std::env::var("DISCORD_TOKEN").map_err(|_| "set DISCORD_TOKEN to the bot's token")?;
    let mut args = std::env::args().skip(1);
    let (Some(guild), Some(role)) = (args.next(), args.next()) else {
        return Err("usage: discord_bot GUILD_ID ROLE_ID MEMBER_ID...".into());
    };
    // Discord's rules: 50 requests/s per token, 10,000 invalid requests per 10 minutes.
    let limits = Client::new(ClientConfig::discord(), Discord);
    let discord = reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
        .with(Limited::discord(limits))
        .build();
    // Every request waits for its bucket and the global limit; a 429 is waited out and the
    // request sent again.
    for user in args {
        let response = discord
            .put(format!(
                "https://discord.com/api/v10/guilds/{guild}/members/{user}/roles/{role}"
            ))
            .header("authorization", format!("Bot {token}"))
            .send()
            .await?;
        println!("{user}: {}", response.status());
    }
    Ok(())
}
