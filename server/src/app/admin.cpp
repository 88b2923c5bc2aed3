#include "app/admin.hpp"

#include "core/config.hpp"

#include "store/database.hpp"
#include "store/db_pool.hpp"
#include "core/log.hpp"
#include "core/metrics.hpp"
#include "core/strings.hpp"
#include "bus/nats_bus.hpp"
#include "api/moderation.hpp"
#include "api/userdata.hpp"
#include "api/provisioning.hpp"
#include "api/webhooks.hpp"
#include "store/store.hpp"

#include <boost/json.hpp>
#include <pqxx/pqxx>

#include <charconv>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <iostream>
#include <map>
#include <set>
#include <sstream>
#include <thread>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

namespace im {

namespace {

struct Usage : std::runtime_error {
    using std::runtime_error::runtime_error;
};

struct Command {
    const char* usage;
    const char* help;   // "" : the usage says it all
};

// The commands, for --help and imserver-admin(8).
const Command commands[] = {
    {"user add USER", "create a user"},
    {"device add USER DEVICE", "create a device; prints its token"},
    {"device revoke DEVICE", "revoke the device's token"},
    {"device token DEVICE", "issue a new token (prints it); the old one stops working"},
    {"conv create CONV --kind group|direct --members U1,U2,...", "create a conversation (join events)"},
    {"conv set CONV [--recall-window-ms N] [--push-full-max N] [--edit-window-ms N]", "change a conversation's settings"},
    {"member add CONV USER | member remove CONV USER", "open/close a period; prints the event's seq"},
    {"epoch bump CONV", "start a new epoch; prints it"},
    {"epoch bump --all", "start a new epoch in every conversation (after a database restore); prints how many"},
    {"purge (CONV | --all) (--before-seq N | --older-than DURATION)",
     "retention purge with tombstones; prints rows purged (DURATION: 30d, 12h, 15m, 45s, 500ms)"},
    {"demo [--out FILE] [--server URL]",
     "demo users ana, ben, cy; conversations ana-ben, team; writes their tokens to FILE "
     "(default STATE/demo-tokens.json)"},
    {"apikey add NAME --scope read|write|admin",
     "make a backend API key (docs/integration.md); prints it, the only time it is shown (only its SHA-256 is kept)"},
    {"apikey revoke NAME", "revoke a backend API key: its next request answers 401"},
    {"apikey list", "backend API keys: name, scope, created, revoked (never the keys)"},
    {"mute set CONV USER [--until ISO-TIME | --for DURATION]",
     "mute USER in CONV (send, edit, react, typing answer MUTED; reads go on); without an end, until cleared; "
     "prints the end"},
    {"mute clear CONV USER", "end USER's mute in CONV"},
    {"redact msg CONV SEQ", "recall msg SEQ as the operator, whatever the window; prints the recall's seq"},
    {"redact user CONV USER",
     "recall every msg of USER in CONV as the operator, in batches (a rerun resumes); prints how many"},
    {"user export USER",
     "everything stored for USER as NDJSON on stdout, written as it is read (docs/operations.md, GDPR requests)"},
    {"user erase USER --yes",
     "erase USER: revoke the devices, close the memberships, recall and empty their events (tombstones kept); "
     "batched, a rerun finishes an interrupted erase; prints what it did as JSON"},
    {"webhook add URL [--events msg,edit,...] [--secret S]",
     "register a webhook (docs/operations.md, Webhooks); prints its id, and the secret when none was given"},
    {"webhook list", "webhooks: id, url, events, backlog, failed ranges, last error (never the secrets)"},
    {"webhook remove ID", "remove a webhook"},
    {"webhook failed ID", "the ranges of events that failed for good: conversation, from, to, attempts, error"},
    {"webhook replay ID --conv CONV --from-seq N", "deliver the conversation's events again from seq N"},
};

// The flags of the commands above (each takes a value).
const std::set<std::string> command_flags = {"--kind",       "--members",    "--recall-window-ms", "--push-full-max", "--edit-window-ms",
                                             "--before-seq", "--older-than", "--out",              "--server",
                                             "--scope",      "--until",      "--for",        "--events",     "--secret",
                                             "--conv",       "--from-seq"};

std::string admin_help() {
    std::string o = "usage: imserver admin [OPTIONS] COMMAND ...\nCommands:\n";
    for (const auto& c : commands) {
        std::string left = std::string("  ") + c.usage;
        o += left.size() < 50 ? left + std::string(50 - left.size(), ' ') : left + "\n" + std::string(50, ' ');
        o += std::string(c.help) + "\n";
    }
    o += "Options (also read from the environment variable shown and the configuration file, as for imserver):\n";
    o += options_help(ConfigScope::admin);
    o += "Exit status: 0 success, 2 bad usage, 1 failure.\n";
    return o;
}

std::int64_t to_i64(const std::string& s, const char* what) {
    std::int64_t v = 0;
    auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
    if (ec != std::errc() || p != s.data() + s.size() || v < 0) throw Usage(std::string(what) + " must be a non-negative integer");
    return v;
}

std::int64_t duration_ms(const std::string& s) {
    try {
        return prov::duration_ms(s);
    } catch (const AdminError& e) {
        throw Usage(e.what());
    }
}

// Arguments after the command words: positionals and --flag VALUE pairs.
struct Args {
    std::vector<std::string> pos;
    std::map<std::string, std::string> flags;
    std::string flag(const std::string& k) const {
        auto it = flags.find(k);
        return it == flags.end() ? std::string() : it->second;
    }
    bool has(const std::string& k) const { return flags.count(k) > 0; }
};

void need(const Args& a, std::size_t n, const char* usage) {
    if (a.pos.size() != n) throw Usage(std::string("usage: imserver admin ") + usage);
}

// `imserver admin webhook ...`: the backend API's answers, printed as lines.
void webhook_command(pqxx::connection_base& c, const std::string& cmd, const Args& args) {
    namespace json = boost::json;
    auto text = [](const json::value& v) {
        return v.is_string() ? std::string(v.as_string()) : v.is_null() ? std::string("-") : json::serialize(v);
    };
    if (cmd == "webhook add") {
        need(args, 1, "webhook add URL [--events msg,edit,...] [--secret S]");
        json::object body{{"url", args.pos[0]}};
        if (args.has("--events")) {
            json::array kinds;
            for (const auto& k : split_commas(args.flag("--events"))) kinds.push_back(json::string(k));
            body["events"] = std::move(kinds);
        }
        if (args.has("--secret")) body["secret"] = args.flag("--secret");
        auto out = webhooks::api_add(c, body);
        std::cout << text(out.body.at("id"));
        if (out.body.contains("secret")) std::cout << '\t' << text(out.body.at("secret"));
        std::cout << '\n';
    } else if (cmd == "webhook list") {
        need(args, 0, "webhook list");
        std::cout << "ID\tURL\tEVENTS\tBACKLOG\tFAILED\tLAST_ERROR\n";
        const auto listed = webhooks::api_list(c);
        for (const auto& w : listed.body.at("webhooks").as_array()) {
            const auto& o = w.as_object();
            std::string kinds;
            for (const auto& k : o.at("events").as_array()) kinds += (kinds.empty() ? "" : ",") + text(k);
            std::cout << text(o.at("id")) << '\t' << text(o.at("url")) << '\t' << kinds << '\t' << text(o.at("backlog"))
                      << '\t' << text(o.at("failed")) << '\t' << text(o.at("last_error")) << '\n';
        }
    } else if (cmd == "webhook remove") {
        need(args, 1, "webhook remove ID");
        webhooks::api_remove(c, args.pos[0]);
    } else if (cmd == "webhook failed") {
        need(args, 1, "webhook failed ID");
        std::cout << "CONV\tFROM_SEQ\tTO_SEQ\tATTEMPTS\tFAILED_AT\tLAST_ERROR\n";
        const auto listed = webhooks::api_deliveries(c, args.pos[0], {{"limit", 1000}});
        for (const auto& f : listed.body.at("deliveries").as_array()) {
            const auto& o = f.as_object();
            std::cout << text(o.at("conv")) << '\t' << text(o.at("from_seq")) << '\t' << text(o.at("to_seq")) << '\t'
                      << text(o.at("attempts")) << '\t' << text(o.at("failed_at")) << '\t' << text(o.at("last_error"))
                      << '\n';
        }
    } else if (cmd == "webhook replay") {
        need(args, 1, "webhook replay ID --conv CONV --from-seq N");
        if (!args.has("--conv") || !args.has("--from-seq")) throw Usage("webhook replay needs --conv CONV --from-seq N");
        webhooks::api_replay(c, args.pos[0],
                             {{"conv", args.flag("--conv")}, {"from_seq", to_i64(args.flag("--from-seq"), "--from-seq")}});
    }
}

// Makes sure USER and DEVICE exist and returns a fresh token for DEVICE.
std::string issue_token(pqxx::connection_base& c, Store& store, const std::string& user, const std::string& device) {
    if (!store.user_exists(c, user)) prov::user_add(store, c, user);
    return store.device_exists(c, device) ? prov::device_token(store, c, device) : prov::device_add(store, c, user, device);
}

std::string demo(pqxx::connection_base& c, Store& store, const std::string& out, const std::string& server) {
    struct U { const char* user; const char* device; };
    const U users[] = {{"ana", "ana-d1"}, {"ben", "ben-d1"}, {"cy", "cy-d1"}};
    // Keep tokens of an earlier run that still work.
    std::map<std::string, std::string> known;
    if (std::ifstream in(out); in) {
        std::stringstream ss;
        ss << in.rdbuf();
        boost::json::error_code ec;
        auto v = boost::json::parse(ss.str(), ec);
        if (!ec && v.is_object() && v.as_object().contains("users") && v.at("users").is_array())
            for (const auto& u : v.at("users").as_array())
                if (u.is_object() && u.as_object().contains("device") && u.as_object().contains("token") &&
                    u.at("device").is_string() && u.at("token").is_string())
                    known[std::string(u.at("device").as_string())] = std::string(u.at("token").as_string());
    }
    boost::json::array list;
    for (const auto& u : users) {
        std::string token = known[u.device];
        if (token.empty() || !store.token_valid(c, u.device, token)) token = issue_token(c, store, u.user, u.device);
        list.push_back(boost::json::object{{"user", u.user}, {"device", u.device}, {"token", token}});
    }
    auto all = store.all_convs(c);
    auto have = [&](const std::string& conv) { return std::find(all.begin(), all.end(), conv) != all.end(); };
    if (!have("ana-ben")) prov::conv_create(store, c, "ana-ben", "direct", {"ana", "ben"});
    if (!have("team")) prov::conv_create(store, c, "team", "group", {"ana", "ben", "cy"});
    boost::json::object doc{{"server", server}, {"users", std::move(list)},
                            {"conversations", boost::json::array{"ana-ben", "team"}}};
    std::filesystem::path p(out);
    if (p.has_parent_path()) std::filesystem::create_directories(p.parent_path());
    std::string tmp = out + ".tmp";
    {
        // Tokens are secrets: owner-only from the first byte, and never
        // written through a symlink someone planted at the temp name.
        ::unlink(tmp.c_str());
        int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
        if (fd < 0) throw std::runtime_error("cannot write " + tmp + ": " + std::strerror(errno));
        const std::string text = boost::json::serialize(doc) + "\n";
        bool ok = ::fchmod(fd, 0600) == 0 && ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
        ok = ::close(fd) == 0 && ok;
        if (!ok) throw std::runtime_error("cannot write " + out);
    }
    std::filesystem::rename(tmp, out);
    return std::filesystem::absolute(out).string();
}

// Hands the committed command's notifications to the NATS bus, waiting
// for a connection for up to 10 s. Without it the gateways would keep a
// revoked device's connections open: failing here is exit status 1, and
// running the same command again publishes again.
void publish_after_commit(const std::string& url, const Notes& notes) {
    Metrics metrics;
    NatsBus bus(url, "admin", metrics);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    bool ok = bus.publish_and_wait(notes);
    while (!ok && std::chrono::steady_clock::now() < deadline) {
        std::this_thread::sleep_for(std::chrono::milliseconds(100)); // the bus connects in the background
        ok = bus.publish_and_wait(notes);
    }
    bus.stop();
    if (!ok)
        throw std::runtime_error("committed, but the notification could not be published on " + url +
                                 ": gateways have not seen it (run the same command again once the bus is back)");
}

int run(int argc, char** argv) {
    std::vector<std::string> config_args;
    std::vector<std::string> words;
    Args args;
    for (int i = 1; i < argc; ++i) {
        std::string a = argv[i];
        if (a == "--help" || a == "-h") {
            std::cout << admin_help();
            return 0;
        }
        auto value = [&](const std::string& name) -> std::string {
            if (i + 1 >= argc) throw Usage(name + " needs a value");
            return argv[++i];
        };
        bool takes_value = false;
        if (is_config_flag(a, ConfigScope::admin, takes_value)) {
            config_args.push_back(a);
            if (takes_value) config_args.push_back(value(a));
        } else if (a == "--all" || a == "--yes") args.flags[a] = "1";
        else if (command_flags.count(a)) args.flags[a] = value(a);
        else if (a.rfind("--", 0) == 0) throw Usage("unknown option '" + a + "' (imserver admin --help)");
        else if (words.size() < 2 && args.pos.empty() && !(words.size() == 1 && (words[0] == "demo" || words[0] == "purge")))
            words.push_back(a);
        else args.pos.push_back(a);
    }
    Config cfg;
    ConfigAction action = ConfigAction::run;
    if (auto e = parse_config(config_args, cfg, ConfigScope::admin, action)) throw Usage(*e);
    const std::string& state_dir = cfg.state_dir;
    for (const auto& f : cfg.faults) { // bad input changes nothing: judged before the database is touched
        std::string point;
        FaultAction fault_action;
        if (auto e = parse_fault_spec(f, point, fault_action)) throw Usage("--fault " + f + ": " + *e);
    }
    if (words.empty()) throw Usage("missing command (imserver admin --help)");
    const std::string cmd = words[0] + (words.size() > 1 ? " " + words[1] : "");
    static const std::set<std::string> known = {"user add",     "device add",   "device revoke", "device token", "conv create",
                                                "conv set",     "member add",   "member remove", "epoch bump",
                                                "purge",        "demo",         "apikey add",    "apikey revoke",
                                                "apikey list",  "mute set",     "mute clear",    "redact msg",
                                                "redact user",  "webhook add",  "webhook list",  "webhook remove",
                                                "webhook failed", "webhook replay", "user export", "user erase"};
    if (!known.count(cmd)) throw Usage("unknown command '" + cmd + "' (imserver admin --help)");

    Database d = open_database(db_conninfo(cfg), state_dir);
    struct StopCluster {
        Database& d;
        ~StopCluster() {
            if (d.started_cluster) d.cluster->stop();
        }
    } stopper{d};
    // An operator's command waits for a busy or starting database (up to
    // start_wait, 30 s), as a gateway's start does, rather than failing on
    // one short connect timeout (3 s).
    const int applied = prepare_schema(d.url);
    if (auto refusal = refuse_foreign_lab_database(d.url, applied, cfg)) throw Usage(*refusal);
    auto conn = open_connection_waiting(d.url, "imserver-admin");
    FaultRegistry faults(cfg.enable_faults);
    for (const auto& f : cfg.faults)
        if (auto e = faults.arm(f)) throw Usage("--fault " + f + ": " + *e);
    Store store(faults, cfg.lab);
    auto& c = *conn;
    Notes notes; // another bus than PostgreSQL: published after the command committed
    if (cfg.bus != "postgres") store.notify_after_commit(&notes);

    if (cmd == "user add") {
        need(args, 1, "user add USER");
        if (!prov::user_add(store, c, args.pos[0])) throw std::runtime_error("user exists: " + args.pos[0]);
    } else if (cmd == "device add") {
        need(args, 2, "device add USER DEVICE");
        std::cout << prov::device_add(store, c, args.pos[0], args.pos[1]) << '\n';
    } else if (cmd == "device token") {
        need(args, 1, "device token DEVICE");
        std::cout << prov::device_token(store, c, args.pos[0]) << '\n';
    } else if (cmd == "device revoke") {
        need(args, 1, "device revoke DEVICE");
        prov::device_revoke(store, c, args.pos[0]);
    } else if (cmd == "conv create") {
        need(args, 1, "conv create CONV --kind group|direct --members U1,U2,...");
        if (!args.has("--kind")) throw Usage("conv create needs --kind group|direct");
        if (!prov::conv_create(store, c, args.pos[0], args.flag("--kind"), split_commas(args.flag("--members"))))
            std::cerr << "imserver admin: conversation " << args.pos[0] << " exists already with these settings\n";
    } else if (cmd == "conv set") {
        need(args, 1, "conv set CONV [--recall-window-ms N] [--push-full-max N] [--edit-window-ms N]");
        std::optional<std::int64_t> rw, pf, ew;
        if (args.has("--recall-window-ms")) rw = to_i64(args.flag("--recall-window-ms"), "--recall-window-ms");
        if (args.has("--push-full-max")) pf = to_i64(args.flag("--push-full-max"), "--push-full-max");
        if (args.has("--edit-window-ms")) ew = to_i64(args.flag("--edit-window-ms"), "--edit-window-ms");
        if (!rw && !pf && !ew) throw Usage("conv set needs --recall-window-ms, --push-full-max and/or --edit-window-ms");
        prov::conv_set(store, c, args.pos[0], rw, pf, ew);
    } else if (cmd == "member add") {
        need(args, 2, "member add CONV USER");
        std::cout << prov::member_add(store, c, args.pos[0], args.pos[1]) << '\n';
    } else if (cmd == "member remove") {
        need(args, 2, "member remove CONV USER");
        std::cout << prov::member_remove(store, c, args.pos[0], args.pos[1]) << '\n';
    } else if (cmd == "epoch bump" && args.has("--all")) {
        // After a database restore: every conversation, each in its own
        // transaction (a rerun after an interruption only bumps again).
        if (!args.pos.empty()) throw Usage("usage: imserver admin epoch bump (CONV | --all)");
        const std::vector<std::string> convs = store.all_convs(c);
        for (const auto& conv : convs) prov::epoch_bump(store, c, conv);
        std::cout << convs.size() << '\n';
    } else if (cmd == "epoch bump") {
        need(args, 1, "epoch bump CONV");
        std::cout << prov::epoch_bump(store, c, args.pos[0]) << '\n';
    } else if (cmd == "purge") {
        bool all = args.has("--all");
        if (all ? !args.pos.empty() : args.pos.size() != 1)
            throw Usage("usage: imserver admin purge (CONV | --all) (--before-seq N | --older-than DURATION)");
        bool by_seq = args.has("--before-seq"), by_age = args.has("--older-than");
        if (by_seq == by_age) throw Usage("purge needs exactly one of --before-seq N, --older-than DURATION");
        if (all && by_seq) throw Usage("--all goes with --older-than");
        std::optional<std::int64_t> before, older;
        if (by_seq) before = to_i64(args.flag("--before-seq"), "--before-seq");
        else older = duration_ms(args.flag("--older-than"));
        std::int64_t n = 0;
        for (const auto& conv : all ? store.all_convs(c) : args.pos) n += prov::purge(store, c, conv, before, older);
        std::cout << n << '\n';
    } else if (cmd == "demo") {
        if (!args.pos.empty()) throw Usage("usage: imserver admin demo [--out FILE] [--server URL]");
        std::string out = args.has("--out") ? args.flag("--out") : state_dir + "/demo-tokens.json";
        std::string server = args.has("--server") ? args.flag("--server") : "ws://127.0.0.1:8080/v1/ws";
        std::cout << demo(c, store, out, server) << '\n';
    } else if (cmd == "apikey add") {
        need(args, 1, "apikey add NAME --scope read|write|admin");
        if (!args.has("--scope")) throw Usage("apikey add needs --scope read|write|admin");
        std::cout << prov::apikey_add(store, c, args.pos[0], args.flag("--scope")) << '\n';
    } else if (cmd == "apikey revoke") {
        need(args, 1, "apikey revoke NAME");
        prov::apikey_revoke(store, c, args.pos[0]);
    } else if (cmd == "apikey list") {
        need(args, 0, "apikey list");
        std::cout << "NAME\tSCOPE\tCREATED\tREVOKED\n";
        for (const auto& k : store.list_api_keys(c))
            std::cout << k.name << '\t' << k.scope << '\t' << k.created << '\t' << (k.revoked.empty() ? "-" : k.revoked)
                      << '\n';
    } else if (cmd == "mute set") {
        need(args, 2, "mute set CONV USER [--until ISO-TIME | --for DURATION]");
        std::optional<std::int64_t> for_ms;
        if (args.has("--for")) for_ms = duration_ms(args.flag("--for"));
        const std::string end =
            mod::mute(store, c, args.pos[0], args.pos[1], args.has("--until") ? args.flag("--until") : "", for_ms);
        std::cout << (end.empty() ? "until cleared" : end) << '\n';
    } else if (cmd == "mute clear") {
        need(args, 2, "mute clear CONV USER");
        if (!mod::unmute(store, c, args.pos[0], args.pos[1]))
            std::cerr << "imserver admin: " << args.pos[1] << " was not muted in " << args.pos[0] << '\n';
    } else if (cmd == "redact msg") {
        need(args, 2, "redact msg CONV SEQ");
        const auto r = mod::redact(store, c, args.pos[0], args.pos[1]);
        if (r.already) std::cerr << "imserver admin: already recalled\n";
        std::cout << r.seq << '\n';
    } else if (cmd == "redact user") {
        need(args, 2, "redact user CONV USER");
        std::cout << mod::redact_user(store, c, args.pos[0], args.pos[1]) << '\n';
    } else if (cmd == "user export") {
        need(args, 1, "user export USER");
        Store::ExportCursor cur;
        bool ended = false;
        for (;;) {
            const std::string chunk = userdata::next_chunk(store, c, args.pos[0], cur, ended);
            if (chunk.empty()) break;
            std::cout << chunk;
            if (!std::cout) throw std::runtime_error("export: stdout failed");
        }
        std::cout.flush();
    } else if (cmd == "user erase") {
        need(args, 1, "user erase USER --yes");
        if (!args.has("--yes")) throw Usage("user erase cannot be undone: add --yes");
        std::cout << boost::json::serialize(userdata::erase(store, c, args.pos[0])) << '\n';
    } else if (cmd.rfind("webhook ", 0) == 0) {
        webhook_command(c, cmd, args);
    }
    if (!notes.empty()) publish_after_commit(cfg.bus, notes);
    return 0;
}

} // namespace

std::string admin_man(const std::string& version) {
    std::string o = ".TH IMSERVER-ADMIN 8 \"\" \"imserver " + version + "\" \"System Administration\"\n"
                    ".SH NAME\nimserver-admin \\- provisioning and operator commands of imserver\n"
                    ".SH SYNOPSIS\n.B imserver admin\n[\\fIOPTIONS\\fR] \\fICOMMAND\\fR ...\n"
                    ".SH DESCRIPTION\n\\fBimserver admin\\fR works on the database a gateway with the same "
                    "options would use: \\fB\\-\\-db\\fR, or the embedded cluster of the state directory "
                    "(started for the command if no gateway runs). It reads the same configuration file as "
                    "\\fBimserver\\fR(8), so on an installed system run it as the service user: "
                    "\\fBsudo \\-u imserver imserver admin\\fR ...\n"
                    ".SH COMMANDS\n";
    for (const auto& c : commands) o += ".TP\n\\fB" + roff_escape(c.usage) + "\\fR\n" + roff_escape(c.help) + ".\n";
    o += ".SH OPTIONS\n" + options_man(ConfigScope::admin);
    o += ".SH EXIT STATUS\n0 success, 1 failure, 2 bad usage.\n"
         ".SH SEE ALSO\n\\fBimserver\\fR(8)\n";
    return o;
}

int admin_main(int argc, char** argv) {
    set_log_quiet(true);
    try {
        return run(argc, argv);
    } catch (const Usage& e) {
        std::cerr << "imserver admin: " << e.what() << '\n';
        return 2;
    } catch (const AdminError& e) {
        // A value the provisioning layer refuses (a bad id, an unknown kind,
        // a setting out of range) is bad usage; the rest is a failure.
        std::cerr << "imserver admin: " << e.what() << '\n';
        return e.kind == AdminError::invalid ? 2 : 1;
    } catch (const pqxx::sql_error& e) {
        // A value the schema refuses (an id outside [A-Za-z0-9._:-]{1,64}, a
        // number out of range) is bad usage too, as the backend API answers
        // it 400; any other database error is a failure.
        const std::string& st = e.sqlstate();
        const bool refused = (st.rfind("22", 0) == 0 || st.rfind("23", 0) == 0) && st != "23505";
        std::cerr << "imserver admin: " << (refused ? "the database refused the value: " : "") << e.what() << '\n';
        return refused ? 2 : 1;
    } catch (const std::exception& e) {
        std::cerr << "imserver admin: " << e.what() << '\n';
        return 1;
    }
}

} // namespace im
