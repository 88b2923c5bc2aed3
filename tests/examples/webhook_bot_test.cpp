// examples/backend/webhook_bot.py against a real imserver (backend API and
// webhook deliverer on) and a real PostgreSQL: it registers its webhook,
// checks signatures, answers "!ping" with "pong" through the API, and a
// redelivery of the same events (a replay) makes no second answer.
#include "harness.hpp"

#include <gtest/gtest.h>

#include <csignal>
#include <cstdlib>
#include <fstream>
#include <spawn.h>
#include <sys/wait.h>

extern char** environ;

using namespace im::test;

namespace {

TEST(ExamplesWebhookBot, answers_a_ping_once_even_when_the_event_is_delivered_again) {
    TestPostgres pg;
    ServerProcess srv(pg.url(), {"--quiet", "--api-listen", "127.0.0.1:0", "--webhook-poll-ms", "20",
                                 "--webhook-refresh-ms", "200"});
    const auto key = admin_ok(pg.url(), {"apikey", "add", "bot", "--scope", "admin"});
    auto call = [&](const std::string& m, const std::string& path, const json::object& body) {
        auto [st, text] = srv.api(m, path, json::serialize(body), key);
        EXPECT_LT(st, 300) << m << ' ' << path << ' ' << text;
        return json::parse(text).as_object();
    };
    const std::string dora = unique_name("dora"), bot = unique_name("helpdesk"), conv = unique_name("help");
    call("POST", "/v1/users", {{"user", dora}});
    call("POST", "/v1/users", {{"user", bot}});
    call("POST", "/v1/conversations", {{"conv", conv}, {"kind", "direct"}, {"members", json::array{dora.c_str(), bot.c_str()}}});

    TempDir dir;
    const std::string ready = dir.path() + "/ready";
    const std::string api = "http://127.0.0.1:" + std::to_string(srv.api_port());
    std::vector<std::string> args = {std::getenv("IM_PYTHON"), std::getenv("IM_EXAMPLE_WEBHOOK_BOT"), "--api", api,
                                     "--listen", "127.0.0.1:0", "--bot", bot, "--ready-file", ready};
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    ::setenv("IM_API_KEY", key.c_str(), 1);
    pid_t pid = -1;
    ASSERT_EQ(::posix_spawn(&pid, argv[0], nullptr, nullptr, argv.data(), environ), 0);
    struct Reap {
        pid_t pid;
        ~Reap() {
            ::kill(pid, SIGKILL);
            ::waitpid(pid, nullptr, 0);
        }
    } reap{pid};
    wait_until([&] { return std::ifstream(ready).good(); }, 30s, "the bot's webhook");
    std::string hook;
    std::ifstream(ready) >> hook;

    auto pongs = [&] {
        return pg.scalar("SELECT count(*) FROM events WHERE conv_id = " + q(conv) + " AND sender_user = " + q(bot) +
                         " AND body = 'pong'");
    };
    const auto sent = call("POST", "/v1/conversations/" + conv + "/messages",
                           {{"sender", dora}, {"cmid", uuid4()}, {"body", "!ping are you there?"}});
    const auto seq = sent.at("seq").as_int64();
    wait_until([&] { return pongs() == "1"; }, 30s, "the bot's pong");
    EXPECT_EQ(pg.scalar("SELECT reply_to FROM events WHERE conv_id = " + q(conv) + " AND body = 'pong'"),
              std::to_string(seq));
    call("POST", "/v1/conversations/" + conv + "/messages", {{"sender", dora}, {"cmid", uuid4()}, {"body", "thanks"}});

    // Everything delivered again: still one pong.
    call("POST", "/v1/webhooks/" + hook + "/replay", {{"conv", conv}, {"from_seq", 1}});
    wait_until([&] {
        return pg.scalar("SELECT done_seq FROM webhook_cursors WHERE conv_id = " + q(conv) + " AND webhook_id = " + q(hook)) ==
               pg.scalar("SELECT next_seq - 1 FROM conversations WHERE conv_id = " + q(conv));
    }, 30s, "the replay delivered");
    EXPECT_EQ(pongs(), "1");
    EXPECT_EQ(srv.metric("im_webhook_deliveries_total{outcome=\"http_error\"}"), 0) << "a signature was refused";

    // SIGTERM: it removes its webhook.
    ::kill(pid, SIGTERM);
    wait_until([&] { return pg.scalar("SELECT count(*) FROM webhooks") == "0"; }, 30s, "the webhook removed");
}

} // namespace
