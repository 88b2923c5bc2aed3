// Safe by default (issue 9 point 8), one test per item, against a real
// imserver and a real PostgreSQL: lab switches refuse a database they did
// not create; start and /readyz check the idempotency index; /lab/fault
// answers loopback callers only; the embedded cluster's folders are made
// safely; secrets files are 0600 and never written through a symlink; the
// raw token never reaches PostgreSQL; the database password comes from a
// file (or the environment), never argv.
#include "common.hpp"
#include "store/pg_cluster.hpp"

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <pqxx/pqxx>

#include <filesystem>
#include <fstream>

#include <ifaddrs.h>
#include <netinet/in.h>
#include <sys/stat.h>
#include <unistd.h>

using namespace im::test;
namespace fs = std::filesystem;

namespace {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;


std::string read_file(const std::string& path) {
    std::ifstream in(path);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
}

// The cluster folder behind a TestPostgres URL ("host=ROOT/run ...").
std::string cluster_root(const std::string& url) {
    auto start = url.find("host=") + 5;
    auto end = url.find(' ', start);
    std::string run = url.substr(start, end - start);
    return run.substr(0, run.size() - 4); // minus "/run"
}

bool index_present(const TestPostgres& pg, const std::string& db) {
    return pg.scalar("SELECT count(*) FROM pg_indexes WHERE indexname = 'events_idempotency'", db) == "1";
}

// An address of this machine that is not loopback (IPv4), or "".
std::string non_loopback_address() {
    ifaddrs* all = nullptr;
    if (::getifaddrs(&all) != 0) return {};
    std::string found;
    for (auto* a = all; a && found.empty(); a = a->ifa_next) {
        if (!a->ifa_addr || a->ifa_addr->sa_family != AF_INET) continue;
        auto bytes = reinterpret_cast<sockaddr_in*>(a->ifa_addr)->sin_addr;
        auto addr = net::ip::address_v4(ntohl(bytes.s_addr));
        if (!addr.is_loopback()) found = addr.to_string();
    }
    ::freeifaddrs(all);
    return found;
}

// POST to host:port from a socket bound to `from`; returns the status.
// A POST from the local address `from` to `to`, naming `host` in its Host
// header: the three are independent, so a server that judged the caller by
// the Host header or by the address it was reached on can be told apart
// from one that judges the caller's own address.
int post_from(const std::string& from, const std::string& to, const std::string& host, unsigned short port,
              const std::string& target, const std::string& body) {
    net::io_context ioc;
    beast::tcp_stream stream(ioc);
    stream.socket().open(tcp::v4());
    stream.socket().bind(tcp::endpoint(net::ip::make_address(from), 0));
    stream.connect(tcp::endpoint(net::ip::make_address(to), port));
    http::request<http::string_body> req{http::verb::post, target, 11};
    req.set(http::field::host, host);
    req.body() = body;
    req.prepare_payload();
    http::write(stream, req);
    beast::flat_buffer buf;
    http::response<http::string_body> res;
    http::read(stream, buf, res);
    return static_cast<int>(res.result_int());
}

} // namespace

TEST(Safety, a_lab_switch_refuses_a_database_it_did_not_create_and_leaves_its_index) {
    TestPostgres pg;
    const std::string db = pg.create_database("users_db");
    admin_ok(db, {"user", "add", "someone"}); // an operator's database: schema made by a normal run
    ASSERT_TRUE(index_present(pg, "users_db"));
    int rc = imserver_exit_code({"--db", db, "--listen", "127.0.0.1:0", "--quiet", "--enable-faults",
                                 "--lab-no-unique-index"},
                                60s);
    EXPECT_EQ(rc, 2);
    EXPECT_TRUE(index_present(pg, "users_db")) << "the lab switch dropped the index of a database it did not create";
    // A database the lab run creates itself is its to alter.
    const std::string lab = pg.create_database("lab_db");
    {
        ServerProcess srv(lab, {"--quiet", "--enable-faults", "--lab-no-unique-index"});
        EXPECT_FALSE(index_present(pg, "lab_db"));
    }
}

TEST(Safety, purge_without_tombstones_refuses_a_database_it_did_not_create_and_purges_nothing) {
    TestPostgres pg;
    // Two messages with request keys in a conversation of `db`, sent through
    // a gateway started with `gateway_flags` (its start makes the schema).
    auto two_messages = [&](const std::string& db, std::vector<std::string> gateway_flags) {
        ServerProcess srv(db, std::move(gateway_flags));
        auto w = make_world(db, "purge", 2);
        auto c = login(srv.port(), w.users[0]);
        for (const char* cmid : {"k1", "k2"}) EXPECT_EQ(str(send_msg(*c, w.conv, cmid, "old"), "t"), "sent");
        return w.conv;
    };
    auto purge_args = [](const std::string& conv) {
        return std::vector<std::string>{"--enable-faults", "--lab-purge-without-tombstones", "purge", conv,
                                        "--before-seq", "100"};
    };

    // An operator's database (schema made by a normal start).
    const std::string db = pg.create_database("users_db");
    const std::string conv = two_messages(db, {"--quiet"});
    auto [rc, out] = admin(db, purge_args(conv));
    EXPECT_EQ(rc, 2) << "admin --lab-purge-without-tombstones ran on a database it did not create: " << out;
    EXPECT_EQ(pg.scalar("SELECT count(*) FROM events WHERE conv_id = " + q(conv), "users_db"), "4")
        << "events were purged (without tombstones) from an operator's database";
    EXPECT_EQ(pg.scalar("SELECT min_seq FROM conversations WHERE conv_id = " + q(conv), "users_db"), "1");
    EXPECT_EQ(imserver_exit_code({"--db", db, "--listen", "127.0.0.1:0", "--quiet", "--enable-faults",
                                  "--lab-purge-without-tombstones"},
                                 60s),
              2)
        << "a gateway with the switch started on a database it did not create";

    // A database whose schema a lab start (--enable-faults) made is the lab's.
    const std::string lab = pg.create_database("lab_db");
    const std::string lab_conv = two_messages(lab, {"--quiet", "--enable-faults"});
    auto [lab_rc, purged] = admin(lab, purge_args(lab_conv));
    EXPECT_EQ(lab_rc, 0);
    EXPECT_EQ(purged, "4\n");
    EXPECT_EQ(pg.scalar("SELECT count(*) FROM idem_tombstones WHERE conv_id = " + q(lab_conv), "lab_db"), "0")
        << "the lab's negative control must purge without tombstones";
}

TEST(Safety, start_and_readyz_check_that_the_idempotency_index_exists) {
    TestPostgres pg;
    const std::string db = pg.url();
    ServerProcess srv(db, {"--quiet"});
    // Ready once its LISTEN session is up too, which may trail the ready file.
    ASSERT_TRUE(wait_until([&] { return srv.http("GET", "/readyz").first == 200; }, 30s));
    pg.scalar("DROP INDEX events_idempotency");
    EXPECT_TRUE(wait_until([&] { return srv.http("GET", "/readyz").first == 503; }, 30s))
        << "/readyz must say not ready without events_idempotency";
    EXPECT_EQ(imserver_exit_code({"--db", db, "--listen", "127.0.0.1:0", "--quiet"}, 60s), 1)
        << "a start without events_idempotency must refuse";
}

TEST(Safety, the_fault_endpoint_answers_loopback_callers_only) {
    const std::string lan = non_loopback_address();
    ASSERT_FALSE(lan.empty()) << "this test needs a non-loopback IPv4 address on the machine";
    TestPostgres pg;
    ServerProcess srv(pg.url(), {"--quiet", "--enable-faults", "--listen", "0.0.0.0:0"});
    EXPECT_EQ(post_from(lan, lan, lan, srv.port(), "/lab/fault", "store.before_commit=delay:1"), 404)
        << "a caller from " << lan << " reached /lab/fault";
    // From the LAN address to the loopback one, saying Host: 127.0.0.1: the
    // caller is still not on loopback.
    EXPECT_EQ(post_from(lan, "127.0.0.1", "127.0.0.1", srv.port(), "/lab/fault", "store.before_commit=delay:1"), 404)
        << "a caller from " << lan << " reached /lab/fault through the loopback address or Host header";
    // From loopback to the LAN address, saying Host: LAN: a loopback caller.
    EXPECT_EQ(post_from("127.0.0.1", lan, lan, srv.port(), "/lab/fault", "off"), 200);
    EXPECT_EQ(post_from("127.0.0.1", "127.0.0.1", "127.0.0.1", srv.port(), "/lab/fault", "off"), 200);
}

TEST(Safety, the_embedded_clusters_folder_is_private_and_a_planted_symlink_is_refused) {
    TempDir state("imsafe");
    TempDir elsewhere("imsafe-target");
    // A symlink someone planted at STATE/pg, to a folder anyone can write to.
    ::chmod(elsewhere.path().c_str(), 0777);
    fs::create_symlink(elsewhere.path(), state.path() + "/pg");
    EXPECT_THROW(im::cluster_root_for_state_dir(state.path()), std::runtime_error);
    // ... or to a symlink (the target itself must be a real directory).
    fs::remove(state.path() + "/pg");
    fs::create_symlink(state.path() + "/pg-hop", state.path() + "/pg");
    fs::create_symlink(elsewhere.path(), state.path() + "/pg-hop");
    EXPECT_THROW(im::cluster_root_for_state_dir(state.path()), std::runtime_error);
    // A link whose target is gone: a fresh mkdtemp folder, never the old path.
    fs::remove(state.path() + "/pg");
    fs::remove(state.path() + "/pg-hop");
    const std::string gone = "/tmp/imserver-pg-gone-" + uuid4();
    fs::create_symlink(gone, state.path() + "/pg");
    std::string root = im::cluster_root_for_state_dir(state.path());
    EXPECT_NE(root, gone);
    EXPECT_FALSE(fs::exists(gone));
    struct stat st {};
    ASSERT_EQ(::lstat(root.c_str(), &st), 0);
    EXPECT_TRUE(S_ISDIR(st.st_mode));
    EXPECT_EQ(st.st_mode & 0777, 0700u);
    EXPECT_EQ(fs::read_symlink(state.path() + "/pg").string(), root);
    im::remove_cluster_for_state_dir(state.path());
}

TEST(Safety, the_demo_token_file_is_owner_only_and_never_written_through_a_symlink) {
    TestPostgres pg;
    TempDir dir("imsafe-demo");
    const std::string out = dir.path() + "/tokens.json";
    const std::string victim = dir.path() + "/victim";
    std::ofstream(victim) << "untouched\n";
    fs::create_symlink(victim, out + ".tmp"); // planted at the temp name
    ::umask(0);                               // no help from the umask
    std::string printed = admin_ok(pg.url(), {"demo", "--out", out});
    ::umask(022);
    EXPECT_EQ(printed, fs::absolute(out).string());
    struct stat st {};
    ASSERT_EQ(::lstat(out.c_str(), &st), 0);
    EXPECT_TRUE(S_ISREG(st.st_mode));
    EXPECT_EQ(st.st_mode & 0777, 0600u);
    EXPECT_NE(read_file(out).find("\"token\""), std::string::npos);
    EXPECT_EQ(read_file(victim), "untouched\n");
}

TEST(Safety, the_raw_token_never_reaches_postgresql) {
    TestPostgres pg;
    ServerProcess srv(pg.url(), {"--quiet"});
    auto u = make_user(pg.url(), unique_name("hashed"));
    pg.scalar("ALTER SYSTEM SET log_statement = 'all'");
    pg.scalar("SELECT pg_reload_conf()");
    const std::string log = cluster_root(pg.url()) + "/postgres.log";
    // Statements (and their parameters) are logged from now on.
    ASSERT_TRUE(wait_until(
        [&] {
            pg.scalar("SELECT 'log-probe-" + u.user + "'");
            return read_file(log).find("log-probe-" + u.user) != std::string::npos;
        },
        30s));
    auto c = login(srv.port(), u);
    EXPECT_EQ(str(c->request({{"t", "convs"}}), "t"), "convs");
    WsClient wrong(srv.port());
    const std::string bad_token = "wrong-" + uuid4();
    EXPECT_EQ(str(wrong.hello(bad_token), "code"), "UNAUTHENTICATED");
    const std::string text = read_file(log);
    EXPECT_NE(text.find("token_sha256 = decode("), std::string::npos) << "the hello statement was not logged";
    EXPECT_EQ(text.find(u.token), std::string::npos) << "the raw token was sent to PostgreSQL";
    EXPECT_EQ(text.find(bad_token), std::string::npos) << "a presented token was sent to PostgreSQL";
}

TEST(Safety, the_database_password_comes_from_a_file_or_the_environment_never_argv) {
    TestPostgres pg;
    const std::string secret = "pw-" + uuid4();
    pg.scalar("CREATE ROLE im_pw LOGIN SUPERUSER PASSWORD '" + secret + "'");
    // This role must prove its password on the local socket.
    const std::string hba = cluster_root(pg.url()) + "/data/pg_hba.conf";
    const std::string rules = read_file(hba);
    std::ofstream(hba, std::ios::trunc) << "local all im_pw scram-sha-256\n" << rules;
    pg.scalar("SELECT pg_reload_conf()");
    std::string db = pg.url(); // "host=... port=... user=... dbname=..."
    auto user_at = db.find("user=");
    db.replace(user_at, db.find(' ', user_at) - user_at, "user=im_pw");
    ASSERT_TRUE(wait_until(
        [&] {
            try {
                pqxx::connection probe(db);
                return false;
            } catch (const std::exception&) {
                return true; // fe_sendauth: no password supplied
            }
        },
        30s))
        << "without its password the role must be refused";

    TempDir dir("imsafe-pw");
    const std::string file = dir.path() + "/pw";
    std::ofstream(file) << secret << "\n";
    {
        ServerProcess srv(db, {"--quiet", "--db-password-file", file});
        // Ready once its workers and its bus session are in (both need the password).
        EXPECT_TRUE(wait_until([&] { return srv.http("GET", "/readyz").first == 200; }, 30s));
        const std::string cmdline = read_file("/proc/" + std::to_string(srv.pid()) + "/cmdline");
        EXPECT_EQ(cmdline.find(secret), std::string::npos) << "the password is in argv";
    }
    {
        ::setenv("IM_DB_PASSWORD_FILE", file.c_str(), 1);
        ServerProcess srv(db, {"--quiet"});
        ::unsetenv("IM_DB_PASSWORD_FILE");
        EXPECT_TRUE(wait_until([&] { return srv.http("GET", "/readyz").first == 200; }, 30s));
    }
    // No option takes the password itself: one would put it in argv.
    EXPECT_EQ(imserver_exit_code({"--db", db, "--listen", "127.0.0.1:0", "--quiet", "--db-password", secret}, 30s), 2)
        << "an option that takes the password on the command line exists";
    EXPECT_EQ(imserver_exit_code({"--db", db, "--listen", "127.0.0.1:0", "--quiet", "--db-password-file",
                                  dir.path() + "/missing"},
                                 30s),
              2);
}

namespace {

// Issue 24, hole 1: production SQL carries no lab switch. The old im_send
// read im.lab_broken, so whoever could set a setting for the gateway's
// sessions (the --db URL's options, PGOPTIONS, ALTER ROLE/DATABASE SET)
// silently turned the send rules off. Every rule still holds here with the
// setting in the URL (each value alone, then all at once) and in the
// database's defaults.
void expect_send_rules_hold(TestPostgres& pg, const std::string& db_url, const std::string& setting) {
    // The setting really reaches a session opened with this URL.
    {
        pqxx::connection probe(db_url);
        EXPECT_EQ(pqxx::nontransaction(probe).exec("SELECT current_setting('im.lab_broken', true)")[0][0].c_str(),
                  setting);
    }
    ServerProcess srv(db_url, {"--quiet"});
    auto w = make_world(pg.url(), unique_name("labset"), 2);
    auto stranger = make_user(pg.url(), unique_name("stranger"));
    auto member = login(srv.port(), w.users[0]);
    auto outsider = login(srv.port(), stranger);

    auto s = send_msg(*outsider, w.conv, "x1", "let me in");
    EXPECT_EQ(str(s, "code"), "NOT_MEMBER") << setting << ": " << json::serialize(s);
    auto u = send_msg(*outsider, unique_name("nosuchconv"), "x2", "anyone?");
    EXPECT_EQ(str(u, "code"), "NOT_MEMBER") << setting << ": " << json::serialize(u);
    EXPECT_EQ(str(s, "msg"), str(u, "msg")) << setting << ": \"not yours\" told from \"unknown\"";
    auto fresh = send_msg(*member, w.conv, "k1", "first body");
    ASSERT_EQ(str(fresh, "t"), "sent") << setting << ": " << json::serialize(fresh);
    EXPECT_FALSE(fresh.at("dup").as_bool()) << setting << ": a fresh send answered dup:true";
    auto resend = send_msg(*member, w.conv, "k1", "first body");
    ASSERT_EQ(str(resend, "t"), "sent") << setting << ": " << json::serialize(resend);
    EXPECT_TRUE(resend.at("dup").as_bool()) << setting << ": the exact resend was judged fresh";
    EXPECT_EQ(resend.at("seq").as_int64(), fresh.at("seq").as_int64()) << setting;
    auto other = send_msg(*member, w.conv, "k1", "another body");
    EXPECT_EQ(str(other, "code"), "IDEMPOTENCY_MISMATCH") << setting << ": " << json::serialize(other);
    auto prev = member->request(
        {{"t", "send"}, {"conv", w.conv}, {"cmid", "k2"}, {"body", "after nothing"}, {"prev", "never-sent"}});
    EXPECT_EQ(str(prev, "code"), "UNAVAILABLE") << setting << ": " << json::serialize(prev);
    EXPECT_EQ(count_rows(pg, "conv_id = " + q(w.conv) + " AND kind = 'msg'"), "1") << setting;
    EXPECT_EQ(count_rows(pg, "sender_user = " + q(stranger.user)), "0") << setting;
}

} // namespace

TEST(NoLabSwitch, a_lab_setting_in_the_database_url_or_the_database_defaults_breaks_no_send_rule) {
    TestPostgres pg;
    const std::vector<std::string> values = {"send_membership", "same_error", "request_hash", "fresh_dup", "send_prev",
                                             "send_dedup"};
    std::string all;
    for (const auto& v : values) all += (all.empty() ? "" : ",") + v;
    for (const auto& v : values) expect_send_rules_hold(pg, pg.url() + " options='-c im.lab_broken=" + v + "'", v);
    expect_send_rules_hold(pg, pg.url() + " options='-c im.lab_broken=" + all + "'", all);
    pg.scalar("ALTER DATABASE im SET im.lab_broken = " + q(all));
    expect_send_rules_hold(pg, pg.url(), all);
    // Nothing in the production database reads the setting, and no lab
    // variant of the send function exists there, even after a start with
    // --enable-faults (the lab installs them only into a database it created).
    ServerProcess lab_flag(pg.url(), {"--quiet", "--enable-faults"});
    EXPECT_EQ(pg.scalar("SELECT count(*) FROM pg_proc WHERE prosrc LIKE '%lab_broken%' OR proname LIKE 'im_lab_%'"),
              "0");
}

TEST(NoLabSwitch, a_lab_run_installs_its_broken_send_functions_only_into_the_database_it_created) {
    TestPostgres pg;
    auto lab_url = pg.create_database("labfresh");
    ServerProcess lab(lab_url, {"--quiet", "--enable-faults"});
    // Nine send variants, each with its own renamed copy of im_send.sql's
    // im_lock_runs; two change variants, each with im_change.sql's
    // im_change_items and im_write_group renamed: never the production ones.
    EXPECT_EQ(pg.scalar("SELECT count(*) FROM pg_proc WHERE proname LIKE 'im\\_lab\\_send\\_%' "
                        "AND proname NOT LIKE '%\\_im\\_lock\\_runs'", "labfresh"), "9");
    EXPECT_EQ(pg.scalar("SELECT count(*) FROM pg_proc WHERE proname LIKE 'im\\_lab\\_send\\_%\\_im\\_lock\\_runs'",
                        "labfresh"), "9");
    EXPECT_EQ(pg.scalar("SELECT count(*) FROM pg_proc WHERE proname LIKE 'im\\_lab\\_change\\_%'", "labfresh"), "6");
    for (const char* production : {"im_send", "im_lock_runs", "im_change", "im_change_items", "im_write_group"})
        EXPECT_EQ(pg.scalar(std::string("SELECT count(*) FROM pg_proc WHERE proname = '") + production + "'", "labfresh"),
                  "1") << production;
    // The armed rule reaches only the lab gateway's own calls.
    auto w = make_world(lab_url, unique_name("labrule"), 2);
    auto stranger = make_user(lab_url, unique_name("stranger"));
    ASSERT_EQ(lab.http("POST", "/lab/fault", "rule.send_membership=skip:1").first, 200);
    auto outsider = login(lab.port(), stranger);
    auto s = send_msg(*outsider, w.conv, "x1", "let me in");
    EXPECT_EQ(str(s, "t"), "sent") << "the lab's control did not break the rule: " << json::serialize(s);
    auto again = send_msg(*outsider, w.conv, "x2", "again");
    EXPECT_EQ(str(again, "code"), "NOT_MEMBER") << "the rule stayed broken after its one armed use";
}

// rule.send_dedup skips the request-key lookup: a resend of the same
// (conv, sender, cmid, body) is judged fresh. With events_idempotency dropped
// (as the no-unique-index control does) it inserts a second event.
TEST(NoLabSwitch, the_send_dedup_variant_inserts_a_second_event_for_a_repeated_request_key) {
    TestPostgres pg;
    auto lab_url = pg.create_database("labdedup");
    ServerProcess lab(lab_url, {"--quiet", "--enable-faults"});
    pg.scalar("DROP INDEX events_idempotency", "labdedup");
    auto w = make_world(lab_url, unique_name("labdedup"), 2);
    auto member = login(lab.port(), w.users[0]);
    auto first = send_msg(*member, w.conv, "d1", "once");
    ASSERT_EQ(str(first, "t"), "sent") << json::serialize(first);
    auto again = send_msg(*member, w.conv, "d1", "once");
    ASSERT_EQ(str(again, "t"), "sent") << json::serialize(again);
    EXPECT_TRUE(again.at("dup").as_bool()) << "unarmed: the resend is the original";
    ASSERT_EQ(lab.http("POST", "/lab/fault", "rule.send_dedup=skip:1").first, 200);
    auto broken = send_msg(*member, w.conv, "d1", "once");
    ASSERT_EQ(str(broken, "t"), "sent") << json::serialize(broken);
    EXPECT_FALSE(broken.at("dup").as_bool()) << "armed: the resend should be judged fresh";
    EXPECT_NE(broken.at("seq").as_int64(), first.at("seq").as_int64());
    EXPECT_EQ(pg.scalar("SELECT count(*) FROM events WHERE client_msg_id = 'd1'", "labdedup"), "2");
}
