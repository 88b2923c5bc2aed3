// libFuzzer target: one client's session against the real request handler
// (server/src/api/api.cpp, send_scheduler.cpp's send path) and the real codec,
// with the database replaced by the in-memory model of memory_store.hpp
// behind the handler's SessionStore seam. Stateful: the input is a program
// of operations (hello, pipelined sends, sync, history, convs, fetch, recall,
// read, ack, malformed frames, close), plus what other parties do meanwhile
// (other users' sends, a leave and a rejoin, a retention purge, time passing,
// the notification bus refusing). Every request is a JSON text frame decoded
// by parse_request and every reply is parsed back with Boost.JSON. On any
// broken promise the target aborts:
//  - every request gets exactly one reply, with its rid (none without one);
//  - a reply is a JSON object no larger than MAX_FRAME, of the success type
//    of its request or an error whose code is one of the contract's;
//  - nothing but hello works before a successful hello (UNAUTHENTICATED, the
//    connection stays open); a failed hello closes it;
//  - a request key answers its first seq and mid with dup:true for ever
//    (until retention: ORIGINAL_EXPIRED), another body IDEMPOTENCY_MISMATCH,
//    and a key never used before is never a duplicate;
//  - a new event's seq is above every seq seen before in its conversation;
//  - a sync walk from 0 sees each seq at most once, ascending, cursors
//    chained; each seq it skips is one `fetch` says the caller may not read,
//    the newest it shows are the events `fetch` returns;
//  - an unknown conversation and one without a period answer byte for byte
//    alike (C4), and so does a recall of a seq the caller may not read;
//  - recall of another user's message is NOT_SENDER, of a seq above the
//    head NOT_FOUND; read and delivery markers never go down;
//  - the events a send hands the gateway's own subscribers are the stored ones.
//
// Input format (tests/fuzz/regressions/session/ holds readable examples):
// one byte picks the operation (a letter below, else byte % 14), then one
// byte per choice; whitespace is skipped, '0'-'9' stand for 0-9, other bytes
// count modulo the number of choices. A request's last choices are its rid
// (7: none) and, except for sends, whether its frame is cut in half (15).
// Conversations: 0 team (ana, ben, cy), 1 ana-ben, 2 gap (ben, ana; ana may
// not read seq 1 and 5), 3 ben-cy, 4 nope (unknown).
//   h token(6: ana, ben, cy, ana's JWT, a badly signed JWT, unknown) install(3)
//   s sends-1(4) conv(5), per send: conv(7: 0-4, 5-6 as before) cmid(10: c0-c9)
//     body(5: hi, ho, recall:3, 3000 x, empty) prev(4: none, the previous
//     cmid, cmid(10), its own) rid
//   y conv after(6: 0, cursor, head seen, 1, 3, 10^6) limit(5: -, 1, 2, 500, 0)
//     epoch(3: -, 1, 2)
//   w conv(3) limit(3: -, 1, 3): sync from 0 to the head, then fetch each seq
//   r conv target(5: own, another's, unreadable, 0, 10^6) which(8) cmid(10)
//   d, a conv seq(4: 0, 1, head seen, 10^6): read, ack
//   i conv before(4: 0, 1, 4, 10^6) limit(3: -, 1, 200): history
//   v after(4: -, ana-ben, m, zz) limit(3: -, 1, 500): convs
//   f conv seq(4: 1, head seen, 10^6, 5): fetch
//   x length(byte) then that many bytes as one frame
//   o others(6: ben sends in team, ana-ben, gap; ana leaves or rejoins gap;
//     purge conv(3) below half its head; 61 s pass)
//   b the bus refuses (again takes) notifications
//   c the connection closes (the next operation is on a new one)
// At the end the open connection walks its conversations once more.
#include "api/api.hpp"
#include "api/jwt.hpp"
#include "core/log.hpp"
#include "memory_store.hpp"
#include "core/protocol.hpp"
#include "api/send_scheduler.hpp"

#include <boost/json.hpp>

#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

namespace {

namespace json = boost::json;
using im::fuzz::MemoryStore;

[[noreturn]] void fail(const char* what, const std::string& detail = {}) {
    std::fprintf(stderr, "fuzz_session: %s %s\n", what, detail.c_str());
    std::abort();
}
#define EXPECT(cond, detail) \
    do {                     \
        if (!(cond)) fail("broken: " #cond, detail); \
    } while (0)

// The contract's error codes (section 8), spelled here, not taken from the code under test.
const std::set<std::string, std::less<>> contract_codes{
    "INVALID_ARGUMENT", "UNAUTHENTICATED",       "NOT_MEMBER", "IDEMPOTENCY_MISMATCH", "ORIGINAL_EXPIRED",
    "NOT_SENDER",       "ALREADY_RECALLED",      "RECALL_WINDOW_EXPIRED", "NOT_FOUND", "CURSOR_AHEAD",
    "EPOCH_CHANGED",    "STALE_INSTALL",         "UNAVAILABLE"};
// The success reply of each request type (section 6).
const std::map<std::string, std::string, std::less<>> success_of{
    {"hello", "welcome"}, {"send", "sent"},       {"sync", "page"},       {"ack", "acked"},
    {"read", "read_ok"},  {"recall", "recalled"}, {"history", "page"},    {"convs", "convs"},
    {"fetch", "fetched"}, {"sub", "subscribed"},  {"refresh", "refreshed"}};

// Valid until 2100, signed with the secret below (tests/fuzz/jwt_seeds.txt): sub ana, device ana-d1.
constexpr std::string_view good_jwt =
    "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiJhbmEiLCJkZXZpY2UiOiJhbmEtZDEiLCJleHAiOjQxMDI0NDQ4MDAsIm5iZiI6MS"
    "wiaWF0IjoxLCJpc3MiOiJodHRwczovL2JhY2tlbmQuZXhhbXBsZSIsImF1ZCI6WyJ4IiwiaW0iXX0.kV6qt4ODWBK3bkSVIppjpxKiy3P0HGUeOGo"
    "G1WmWR2c";

const im::jwt::Verifier& verifier() {
    static const im::jwt::Verifier* v = [] {
        const std::string path = "/tmp/fuzz_session_hs256." + std::to_string(::getpid());
        std::ofstream(path) << "fuzz-secret-0123456789abcdef-0123456789";
        auto* made = new im::jwt::Verifier(path, "", im::jwt::Settings{"https://backend.example", "im"});
        if (auto e = made->reload()) fail("jwt set-up:", *e);
        std::remove(path.c_str());
        return made;
    }();
    return *v;
}

// A bus that takes payloads, or refuses them while `up` is false.
class Bus final : public im::NotificationBus {
public:
    bool up = true;
    void subscribe(Handlers) override {}
    void stop() override {}
    void publish(std::vector<std::string>, std::function<void(bool)> done) override { done(up); }
    bool connected() const override { return up; }
};

// The input, one choice at a time; zeros once it runs out.
class Input {
public:
    Input(const std::uint8_t* d, std::size_t n) : d_(d), n_(n) {}
    bool done() const { return i_ >= n_; }
    std::uint8_t byte() { return i_ < n_ ? d_[i_++] : 0; }
    /// A choice in [0, n): whitespace is skipped, '0'-'9' stand for 0-9.
    int pick(int n) {
        std::uint8_t b = byte();
        while (b == ' ' || b == '\n' || b == '\t') b = byte();
        return (b >= '0' && b <= '9' ? b - '0' : b) % n;
    }
    std::string take(std::size_t n) {
        n = std::min(n, n_ - std::min(i_, n_));
        std::string s(reinterpret_cast<const char*>(d_ + i_), n);
        i_ += n;
        return s;
    }

private:
    const std::uint8_t* d_;
    std::size_t n_, i_ = 0;
};

constexpr std::int64_t beyond = 1'000'000; // above any head an input can reach
const std::array<std::string, 5> convs{"team", "ana-ben", "gap", "ben-cy", "nope"};
const std::array<std::string, 3> tokens{"tok-ana-7f3a9c", "tok-ben-51e0d2", "tok-cy-90b4aa"};

struct KeyState {
    std::string fingerprint;            // of the first attempt
    bool succeeded = false;             // a success reply was seen: seq and mid below
    std::int64_t seq = 0;
    std::string mid;
    std::set<std::string> attempted;    // fingerprints sent under this key
};

class Session {
public:
    explicit Session(Input& in) : in_(in) {
        for (std::size_t i = 0; i < tokens.size(); ++i) {
            static const char* users[] = {"ana", "ben", "cy"};
            db_.add_device(users[i], std::string(users[i]) + "-d1", tokens[i]);
        }
        db_.add_conv("team", "group", {"ana", "ben", "cy"});
        db_.add_conv("ana-ben", "direct", {"ana", "ben"});
        db_.add_conv("ben-cy", "direct", {"ben", "cy"});
        db_.add_conv("gap", "group", {"ben", "ana"});
        other_send("gap"); // 3
        db_.leave("gap", "ana");
        other_send("gap"); // 5: ana may not read it
        db_.join("gap", "ana");
        ctx_.bus = &bus_;
        ctx_.jwt = &verifier();
        // What the gateway hands its own subscribers is what was stored (a duplicate: the original).
        ctx_.committed = [this](const std::vector<im::Event>& events) {
            for (const auto& ev : events) {
                const im::Event* s = db_.stored(ev.conv, ev.seq);
                EXPECT(s && s->mid == ev.mid && s->sender == ev.sender && s->body == ev.body && s->cmid == ev.cmid &&
                           s->ts == ev.ts && s->epoch == ev.epoch,
                       ev.conv + " " + std::to_string(ev.seq));
            }
        };
    }

    void run() {
        static const char ops[] = "hsywrdaivfxobc";
        while (!in_.done()) {
            const std::uint8_t b = in_.byte();
            if (b == ' ' || b == '\n' || b == '\t') continue;
            switch (b != 0 && std::strchr(ops, b) ? static_cast<char>(b) : ops[b % 14]) {
            case 'h': hello(); break;
            case 's': sends(); break;
            case 'y': sync(); break;
            case 'w': walk(); break;
            case 'r': recall(); break;
            case 'd': marker("read"); break;
            case 'a': marker("ack"); break;
            case 'i': history(); break;
            case 'v': list_convs(); break;
            case 'f': fetch(); break;
            case 'x': raw(); break;
            case 'o': others(); break;
            case 'b': bus_.up = !bus_.up; break;
            default: who_.reset(); break; // 'c': the connection closes; the next op opens another
            }
        }
        for (int c = 0; c < 3 && who_; ++c) walk_conv(convs[c], 2); // close: every conversation walked once more
    }

private:
    // ---------------------------------------------------------------- frames and replies

    std::optional<std::string> next_rid() {
        if (in_.pick(8) == 7) return std::nullopt; // a request without rid
        return "r" + std::to_string(++rids_);
    }

    // The reply as JSON, after the checks every reply gets.
    json::object check_reply(const im::Handled& h, const std::optional<std::string>& rid, std::string_view type) {
        EXPECT(!h.frame.empty(), "no reply");
        EXPECT(h.frame.size() <= im::max_frame_bytes, std::to_string(h.frame.size()));
        json::error_code ec;
        json::value v = json::parse(h.frame, ec);
        EXPECT(!ec && v.is_object(), h.frame);
        json::object o = v.as_object();
        const auto* t = o.if_contains("t");
        EXPECT(t && t->is_string(), h.frame);
        const auto* r = o.if_contains("rid");
        if (rid) EXPECT(r && r->is_string() && r->get_string() == *rid, h.frame);
        else EXPECT(!r, h.frame);
        if (t->get_string() == "error") {
            const auto* code = o.if_contains("code");
            EXPECT(code && code->is_string() && contract_codes.count(std::string(code->get_string())), h.frame);
            EXPECT(o.if_contains("msg") && o.at("msg").is_string(), h.frame);
            EXPECT(h.code == code->get_string(), h.code);
            EXPECT(!h.identity, h.frame);
        } else {
            auto s = success_of.find(type);
            EXPECT(s != success_of.end() && t->get_string() == s->second, h.frame);
            EXPECT(h.code == "OK", h.code);
            EXPECT(!h.close_after, h.frame);
        }
        return o;
    }

    static std::string code_of(const json::object& o) {
        return o.at("t").get_string() == "error" ? std::string(o.at("code").get_string()) : "OK";
    }

    // One frame through the decoder and, if it decodes, the handler; the
    // session's rules (hello first, close after a failed hello) as the
    // WebSocket session applies them. Returns the reply, checked.
    json::object request(json::object frame, std::string_view type) {
        auto rid = next_rid();
        if (rid) frame["rid"] = *rid;
        std::string text = json::serialize(frame);
        const bool broken = in_.pick(16) == 15;
        if (broken) text.resize(text.size() / 2); // now and then a broken frame: its rid may be unreadable
        im::Parsed p = im::parse_request(text);
        if (!broken) EXPECT(p.rid == rid, text);
        return through(p, type);
    }

    json::object through(const im::Parsed& p, std::string_view type) {
        if (const auto* e = std::get_if<im::Error>(&p.body)) {
            im::Handled h = im::error_reply(*e, p.rid);
            auto o = check_reply(h, p.rid, type);
            EXPECT(code_of(o) == "INVALID_ARGUMENT", h.frame);
            return o;
        }
        const auto& req = std::get<im::Request>(p.body);
        const bool hello = std::holds_alternative<im::req::Hello>(req);
        const bool was = who_.has_value();
        im::Handled h = im::handle_request(ctx_, &db_, who_, req, p.rid);
        auto o = check_reply(h, p.rid, im::request_name(req));
        const std::string code = code_of(o);
        if (!was && !hello) { // nothing before hello
            EXPECT(code == "UNAUTHENTICATED" && !h.close_after, h.frame);
        }
        if (hello && was) EXPECT(code == "INVALID_ARGUMENT" && !h.close_after && !h.identity, h.frame);
        if (hello && !was) {
            EXPECT((code == "OK") == h.identity.has_value(), h.frame);
            if (code == "UNAUTHENTICATED" || code == "STALE_INSTALL") EXPECT(h.close_after, h.frame);
            if (h.identity) who_ = h.identity;
        }
        if (h.close_after) who_.reset(); // the server closes: the next op opens another connection
        return o;
    }

    // C4: the exact error of an unknown conversation.
    void expect_not_member(const json::object& o, const std::optional<std::string>& rid) {
        EXPECT(json::serialize(o) == json::serialize(json::parse(im::encode_error(im::not_member(), rid))),
               json::serialize(o));
    }
    // Per-user facts are kept under "user/conv".
    std::string mine(const std::string& conv) const { return who_->user + "/" + conv; }
    // A conversation the caller never had a period in, or none at all (C4).
    bool hidden(const std::string& conv) const {
        static const std::set<std::pair<std::string, std::string>> periods{
            {"ana", "team"}, {"ana", "ana-ben"}, {"ana", "gap"}, {"ben", "team"}, {"ben", "ana-ben"},
            {"ben", "gap"},  {"ben", "ben-cy"},  {"cy", "team"}, {"cy", "ben-cy"}};
        return !who_ || !periods.count({who_->user, conv});
    }

    // ---------------------------------------------------------------- operations

    void hello() {
        const int t = in_.pick(6);
        std::string token = t < 3 ? tokens[static_cast<std::size_t>(t)] : std::string(good_jwt);
        if (t == 4) { // a bad signature (a whole character inside it: the last one carries padding bits)
            auto& ch = token[token.size() - 10];
            ch = ch == 'A' ? 'B' : 'A';
        }
        if (t == 5) token = "tok-nobody";
        json::object f{{"t", "hello"}, {"token", token}, {"install", "inst-" + std::to_string(in_.pick(3))}};
        auto o = request(f, "hello");
        static const char* users[] = {"ana", "ben", "cy", "ana"};
        if (t >= 4) EXPECT(code_of(o) != "OK", json::serialize(o)); // a bad token never works
        else if (code_of(o) == "OK") EXPECT(who_ && who_->user == users[t] && o.at("user").get_string() == users[t], json::serialize(o));
    }

    void sends() {
        const int n = 1 + in_.pick(4);
        std::vector<std::string> texts;
        std::vector<std::optional<std::string>> rids;
        std::string conv = convs[static_cast<std::size_t>(in_.pick(5))];
        std::string last_cmid;
        for (int i = 0; i < n; ++i) {
            const int c = in_.pick(7);
            if (c < 5) conv = convs[static_cast<std::size_t>(c)];
            const std::string cmid = "c" + std::to_string(in_.pick(10));
            static const std::array<std::string, 4> bodies{"hi", "ho", "recall:3", std::string(3000, 'x')};
            const int b = in_.pick(5);
            json::object f{{"t", "send"}, {"conv", conv}, {"cmid", cmid}, {"body", b < 4 ? bodies[static_cast<std::size_t>(b)] : ""}};
            const int pv = in_.pick(4);
            if (pv == 1 && !last_cmid.empty()) f["prev"] = last_cmid;
            if (pv == 2) f["prev"] = "c" + std::to_string(in_.pick(10));
            if (pv == 3) f["prev"] = cmid;
            last_cmid = cmid;
            auto rid = next_rid();
            if (rid) f["rid"] = *rid;
            texts.push_back(json::serialize(f));
            rids.push_back(rid);
        }
        // Pipelined: decoded in order; consecutive sends to one conversation
        // of an authenticated connection go as one run (as ws_session does).
        std::vector<im::req::Send> run;
        std::vector<std::optional<std::string>> run_rids;
        auto flush = [&] {
            if (run.empty()) return;
            auto hs = im::send_run_and_wait(ctx_, &db_, *who_, std::vector<im::req::Write>(run.begin(), run.end()),
                                            run_rids);
            EXPECT(hs.size() == run.size(), std::to_string(hs.size()));
            for (std::size_t i = 0; i < hs.size(); ++i) judge_send(run[i], run_rids[i], hs[i]);
            run.clear();
            run_rids.clear();
        };
        for (std::size_t i = 0; i < texts.size(); ++i) {
            im::Parsed p = im::parse_request(texts[i]);
            EXPECT(p.rid == rids[i], texts[i]);
            const auto* req = std::get_if<im::Request>(&p.body);
            const auto* s = req ? std::get_if<im::req::Send>(req) : nullptr;
            if (!s || !who_) { // errors and the unauthenticated go alone, in order
                flush();
                through(p, "send");
                continue;
            }
            if (!run.empty() && run.front().conv != s->conv) flush();
            run.push_back(*s);
            run_rids.push_back(p.rid);
        }
        flush();
    }

    void judge_send(const im::req::Send& s, const std::optional<std::string>& rid, const im::Handled& h) {
        auto o = check_reply(h, rid, "send");
        const std::string code = code_of(o);
        if (hidden(s.conv)) return expect_not_member(o, rid);
        judge_key(s.conv, s.cmid, "msg:" + s.body, o, code);
    }

    // The request key's promises, for a send or a recall (`fp` its fingerprint,
    // led by its kind: a send and a recall never share one, C3).
    void judge_key(const std::string& conv, const std::string& cmid, const std::string& fp, const json::object& o,
                   const std::string& code) {
        auto& k = keys_[{conv, who_->user, cmid}];
        const bool fresh = k.attempted.empty();
        k.attempted.insert(fp);
        if (code == "OK") {
            const std::int64_t seq = o.at("seq").to_number<std::int64_t>();
            const bool dup = o.at("dup").as_bool();
            EXPECT(o.at("conv").get_string() == conv, json::serialize(o));
            if (k.succeeded) {
                EXPECT(k.fingerprint == fp, json::serialize(o)); // another body under a used key is no success
                EXPECT(dup && seq == k.seq, json::serialize(o));
                if (o.contains("mid") && !k.mid.empty()) EXPECT(o.at("mid").get_string() == k.mid, json::serialize(o));
                if (o.contains("mid")) k.mid = o.at("mid").get_string(); // a recall's reply carries none
                EXPECT(!expired_.count({conv, seq}), json::serialize(o));
                return;
            }
            if (fresh) EXPECT(!dup, json::serialize(o));
            if (!dup) EXPECT(seq > max_seq_[conv], json::serialize(o));
            k.succeeded = true;
            k.fingerprint = fp;
            k.seq = seq;
            if (o.contains("mid")) k.mid = o.at("mid").get_string();
            max_seq_[conv] = std::max(max_seq_[conv], seq);
            return;
        }
        if (code == "IDEMPOTENCY_MISMATCH") EXPECT(!fresh && (!k.succeeded || k.fingerprint != fp), json::serialize(o));
        if (code == "ORIGINAL_EXPIRED") EXPECT(!fresh, json::serialize(o));
        if (k.succeeded && k.fingerprint == fp)
            EXPECT(code == "ORIGINAL_EXPIRED" || code == "UNAVAILABLE", json::serialize(o));
        if (k.succeeded && expired_.count({conv, k.seq})) EXPECT(code == "ORIGINAL_EXPIRED", json::serialize(o));
    }

    std::int64_t cursor_choice(const std::string& conv, int c) {
        switch (c) {
        case 0: return 0;
        case 1: return cursor_[conv];
        case 2: return max_seq_[conv];
        case 3: return 1;
        case 4: return 3;
        default: return beyond;
        }
    }

    void sync() {
        const std::string conv = convs[static_cast<std::size_t>(in_.pick(5))];
        json::object f{{"t", "sync"}, {"conv", conv}, {"after", cursor_choice(conv, in_.pick(6))}};
        static const int limits[] = {50, 1, 2, 500, 0}; // 500 is cut to 200, 0 is refused
        if (int l = in_.pick(5)) f["limit"] = limits[l];
        if (int e = in_.pick(3)) f["epoch"] = e;
        const auto after = f.at("after").as_int64();
        auto o = request(f, "sync");
        if (hidden(conv) && code_of(o) != "INVALID_ARGUMENT" && code_of(o) != "UNAUTHENTICATED")
            return expect_not_member(o, o.contains("rid") ? std::optional<std::string>(o.at("rid").get_string()) : std::nullopt);
        if (code_of(o) == "OK") {
            check_page(o, conv, after);
            cursor_[conv] = o.at("next_after").to_number<std::int64_t>();
        }
    }

    // A sync page's own promises; returns its seqs.
    std::vector<std::int64_t> check_page(const json::object& o, const std::string& conv, std::int64_t after) {
        std::vector<std::int64_t> seqs;
        const auto head = o.at("head").to_number<std::int64_t>();
        const auto next = o.at("next_after").to_number<std::int64_t>();
        std::int64_t last = after;
        for (const auto& v : o.at("events").as_array()) {
            const auto& ev = v.as_object();
            const auto seq = ev.at("seq").to_number<std::int64_t>();
            EXPECT(seq > last && seq <= head && ev.at("conv").get_string() == conv, json::serialize(o));
            last = seq;
            seqs.push_back(seq);
            learn(conv, ev);
        }
        EXPECT(next >= last && next <= head, json::serialize(o));
        if (!o.at("has_more").as_bool()) EXPECT(next == head, json::serialize(o));
        else EXPECT(!seqs.empty() && next == seqs.back(), json::serialize(o));
        max_seq_[conv] = std::max(max_seq_[conv], head);
        return seqs;
    }

    // What an event shown to the session says about keys and other users' messages.
    void learn(const std::string& conv, const json::object& ev) {
        const auto seq = ev.at("seq").to_number<std::int64_t>();
        const std::string sender = ev.contains("sender") ? std::string(ev.at("sender").get_string()) : "";
        if (ev.at("kind").get_string() == "msg" && who_ && sender != who_->user) others_[mine(conv)].insert(seq);
        if (who_ && sender == who_->user && ev.contains("cmid")) {
            auto k = keys_.find({conv, who_->user, std::string(ev.at("cmid").get_string())});
            if (k != keys_.end() && k->second.succeeded) EXPECT(k->second.seq == seq, json::serialize(ev));
        }
    }

    void walk() {
        const std::string conv = convs[static_cast<std::size_t>(in_.pick(3))];
        walk_conv(conv, in_.pick(3));
    }

    // Follows the cursor from 0 to the head, then asks fetch about every seq
    // the walk skipped and the newest it showed.
    void walk_conv(const std::string& conv, int limit_choice) {
        if (!who_) return;
        std::int64_t after = 0, head = 0, min_seq = 1;
        std::set<std::int64_t> seen;
        for (int pages = 0; pages < 1000; ++pages) {
            json::object f{{"t", "sync"}, {"conv", conv}, {"after", after}, {"rid", "walk"}};
            if (limit_choice) f["limit"] = limit_choice == 1 ? 1 : 3;
            im::Handled h = im::handle_request(ctx_, &db_, who_, std::get<im::Request>(im::parse_request(json::serialize(f)).body),
                                               std::string("walk"));
            auto o = check_reply(h, std::string("walk"), "sync");
            if (code_of(o) != "OK") return;
            for (auto s : check_page(o, conv, after)) EXPECT(seen.insert(s).second, json::serialize(o));
            head = o.at("head").to_number<std::int64_t>();
            min_seq = o.at("min_seq").to_number<std::int64_t>();
            after = o.at("next_after").to_number<std::int64_t>();
            if (!o.at("has_more").as_bool()) break;
        }
        for (std::int64_t s = min_seq; s <= head; ++s) {
            if (seen.count(s) && s + 5 <= head) continue; // of the events shown, the newest five (time)
            json::object f{{"t", "fetch"}, {"conv", conv}, {"seq", s}};
            im::Handled h = im::handle_request(ctx_, &db_, who_, std::get<im::Request>(im::parse_request(json::serialize(f)).body),
                                               std::nullopt);
            auto o = check_reply(h, std::nullopt, "fetch");
            if (seen.count(s)) {
                EXPECT(code_of(o) == "OK" && o.at("ev").as_object().at("seq").to_number<std::int64_t>() == s,
                       json::serialize(o));
                learn(conv, o.at("ev").as_object());
            } else {
                EXPECT(code_of(o) == "NOT_MEMBER", json::serialize(o)); // skipped: not readable, nothing else
                unreadable_[mine(conv)].insert(s);
            }
        }
    }

    void recall() {
        const std::string conv = convs[static_cast<std::size_t>(in_.pick(5))];
        const int t = in_.pick(5);
        std::int64_t target = beyond;
        auto any_of = [](const std::set<std::int64_t>& s, int i) {
            return s.empty() ? beyond : *std::next(s.begin(), static_cast<long>(i % s.size()));
        };
        std::vector<std::int64_t> own;
        for (const auto& [key, k] : keys_)
            if (std::get<0>(key) == conv && who_ && std::get<1>(key) == who_->user && k.succeeded) own.push_back(k.seq);
        const int i = in_.pick(8);
        if (t == 0 && !own.empty()) target = own[static_cast<std::size_t>(i) % own.size()];
        if (t == 1 && who_) target = any_of(others_[mine(conv)], i);
        if (t == 2 && who_) target = any_of(unreadable_[mine(conv)], i);
        if (t == 3) target = 0;
        const std::string cmid = "c" + std::to_string(in_.pick(10));
        const bool fresh = !who_ || !keys_.count({conv, who_->user, cmid});
        auto o = request(json::object{{"t", "recall"}, {"conv", conv}, {"target", target}, {"cmid", cmid}}, "recall");
        const std::string code = code_of(o);
        if (!who_ || code == "INVALID_ARGUMENT" || code == "UNAUTHENTICATED") return;
        const std::optional<std::string> rid =
            o.contains("rid") ? std::optional<std::string>(o.at("rid").get_string()) : std::nullopt;
        if (hidden(conv)) return expect_not_member(o, rid);
        if (fresh && t == 1 && others_[mine(conv)].count(target))
            EXPECT(code == "NOT_SENDER" || code == "NOT_FOUND", json::serialize(o));
        if (fresh && t == 2 && unreadable_[mine(conv)].count(target) && !expired_.count({conv, target}))
            expect_not_member(o, rid); // C4: a seq the caller may not read is as unknown as the conversation
        if (fresh && target == beyond) EXPECT(code == "NOT_FOUND", json::serialize(o));
        judge_key(conv, cmid, "recall:" + std::to_string(target), o, code);
    }

    void marker(const std::string& type) {
        const std::string conv = convs[static_cast<std::size_t>(in_.pick(5))];
        static const std::int64_t seqs[] = {0, 1, -1, beyond};
        const int c = in_.pick(4);
        const std::int64_t seq = c == 2 ? max_seq_[conv] : seqs[c];
        auto o = request(json::object{{"t", type}, {"conv", conv}, {"seq", seq}}, type);
        const std::string code = code_of(o);
        if (!who_ || code == "INVALID_ARGUMENT" || code == "UNAUTHENTICATED") return;
        if (hidden(conv)) return expect_not_member(o, o.contains("rid") ? std::optional<std::string>(o.at("rid").get_string()) : std::nullopt);
        if (code != "OK") return;
        const auto now = o.at(type == "read" ? "read" : "delivered").to_number<std::int64_t>();
        auto& before = type == "read" ? read_[{conv, who_->user}] : delivered_[{conv, who_->device}];
        EXPECT(now >= before && now >= seq, json::serialize(o)); // never goes down
        before = now;
    }

    void history() {
        const std::string conv = convs[static_cast<std::size_t>(in_.pick(5))];
        static const std::int64_t befores[] = {0, 1, 4, beyond};
        json::object f{{"t", "history"}, {"conv", conv}, {"before", befores[in_.pick(4)]}};
        if (int l = in_.pick(3)) f["limit"] = l == 1 ? 1 : 200;
        const auto before = f.at("before").as_int64();
        auto o = request(f, "history");
        if (code_of(o) != "OK") return;
        const auto head = o.at("head").to_number<std::int64_t>();
        std::int64_t last = 0;
        for (const auto& v : o.at("events").as_array()) {
            const auto seq = v.as_object().at("seq").to_number<std::int64_t>();
            EXPECT(seq > last && seq <= head && (before == 0 || seq < before), json::serialize(o));
            last = seq;
            learn(conv, v.as_object());
        }
        const auto& evs = o.at("events").as_array();
        if (!evs.empty()) EXPECT(o.at("oldest").to_number<std::int64_t>() <= evs.front().as_object().at("seq").to_number<std::int64_t>(), json::serialize(o));
    }

    void list_convs() {
        static const std::array<std::string, 4> afters{"", "ana-ben", "m", "zz"};
        json::object f{{"t", "convs"}};
        const std::string after = afters[static_cast<std::size_t>(in_.pick(4))];
        if (!after.empty()) f["after"] = after;
        if (int l = in_.pick(3)) f["limit"] = l == 1 ? 1 : 500;
        auto o = request(f, "convs");
        if (code_of(o) != "OK") return;
        std::string last = after;
        for (const auto& v : o.at("convs").as_array()) {
            const std::string c(v.as_object().at("conv").get_string());
            EXPECT(c > last && !hidden(c), json::serialize(o));
            last = c;
        }
    }

    void fetch() {
        const std::string conv = convs[static_cast<std::size_t>(in_.pick(5))];
        static const std::int64_t seqs[] = {1, 0, beyond, 5};
        const int c = in_.pick(4);
        const std::int64_t seq = c == 1 ? max_seq_[conv] : seqs[c];
        auto o = request(json::object{{"t", "fetch"}, {"conv", conv}, {"seq", seq}}, "fetch");
        const std::string code = code_of(o);
        if (!who_ || code == "INVALID_ARGUMENT" || code == "UNAUTHENTICATED") return;
        if (hidden(conv)) return expect_not_member(o, o.contains("rid") ? std::optional<std::string>(o.at("rid").get_string()) : std::nullopt);
        if (code == "OK") {
            const auto& ev = o.at("ev").as_object();
            EXPECT(ev.at("seq").to_number<std::int64_t>() == seq && ev.at("conv").get_string() == conv, json::serialize(o));
            learn(conv, o.at("ev").as_object());
        }
        if (seq == beyond) EXPECT(code == "NOT_FOUND", json::serialize(o));
    }

    // Any bytes as one frame (the dictionary and the corpus make them frames).
    void raw() {
        const std::string text = in_.take(in_.byte());
        json::error_code ec;
        std::optional<std::string> rid;
        auto v = json::parse(text, ec);
        if (!ec && v.is_object())
            if (const auto* r = v.as_object().if_contains("rid"); r && r->is_string()) rid = std::string(r->get_string());
        im::Parsed p = im::parse_request(text);
        const auto* req = std::get_if<im::Request>(&p.body);
        if (rid && req) EXPECT(p.rid == rid, text); // a valid request keeps its rid
        const bool authenticated = who_.has_value();
        auto o = through(p, p.type);
        if (!req || !authenticated || !who_) return;
        // A send or recall made this way uses its key like any other (the lone send path).
        if (const auto* s = std::get_if<im::req::Send>(req)) {
            if (hidden(s->conv)) return expect_not_member(o, p.rid);
            judge_key(s->conv, s->cmid, "msg:" + s->body, o, code_of(o));
        } else if (const auto* r = std::get_if<im::req::Recall>(req)) {
            if (hidden(r->conv)) return expect_not_member(o, p.rid);
            judge_key(r->conv, r->cmid, "recall:" + std::to_string(r->target), o, code_of(o));
        }
    }

    // What other parties do meanwhile.
    void other_send(const std::string& conv) {
        im::Identity ben{"ben", "ben-d1", "inst-ben", "t:ben-d1"};
        im::req::Send s{conv, "ben-" + std::to_string(++others_sent_), "from ben", "", std::nullopt};
        auto r = db_.send_run(ben, {s});
        if (r.size() != 1 || !r[0]) fail("set-up: ben's send failed");
    }

    void others() {
        switch (in_.pick(6)) {
        case 0: other_send("team"); break;
        case 1: other_send("ana-ben"); break;
        case 2: other_send("gap"); break;
        case 3: // ana leaves "gap" or comes back
            if (gap_left_) db_.join("gap", "ana");
            else db_.leave("gap", "ana");
            gap_left_ = !gap_left_;
            for (auto& [k, seqs] : unreadable_)
                if (k.ends_with("/gap")) seqs.clear();
            break;
        case 4: { // retention: the older half of a conversation goes
            const std::string conv = convs[static_cast<std::size_t>(in_.pick(3))];
            const std::int64_t before = max_seq_[conv] / 2 + 1;
            db_.purge(conv, before);
            for (std::int64_t s = 1; s < before; ++s) expired_.insert({conv, s});
            break;
        }
        default: db_.now_ms += 61'000; break; // past a recall window after two
        }
    }

    Input& in_;
    MemoryStore db_;
    im::FaultRegistry faults_{false};
    im::Store unused_store_{faults_, {}}; // ApiContext's; never called by the handler's session requests
    Bus bus_;
    im::ApiContext ctx_{unused_store_, faults_, "gw-fuzz", nullptr, {}, nullptr};
    std::optional<im::Identity> who_;
    std::map<std::tuple<std::string, std::string, std::string>, KeyState> keys_; // (conv, user, cmid)
    std::map<std::string, std::int64_t> max_seq_, cursor_;
    std::map<std::string, std::set<std::int64_t>> others_, unreadable_; // by mine(conv): others' msgs, seqs not readable
    std::set<std::pair<std::string, std::int64_t>> expired_;
    std::map<std::pair<std::string, std::string>, std::int64_t> read_, delivered_;
    long rids_ = 0;
    int others_sent_ = 0;
    bool gap_left_ = false;
};

} // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
    im::set_log_quiet(true); // refused JWTs are logged at info
    return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    Input in(data, size);
    Session s(in);
    s.run();
    return 0;
}
