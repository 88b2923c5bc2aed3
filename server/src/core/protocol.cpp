#include "core/protocol.hpp"

#include <boost/json.hpp>

#include <algorithm>
#include <charconv>

namespace im {
namespace json = boost::json;

namespace {

// Field readers. Each returns an error message for INVALID_ARGUMENT, or
// nothing when the field is good.
struct Fields {
    const json::object& o;
    const FieldBounds& b;

    std::optional<std::string> str(std::string_view key, std::string& out) const {
        auto* v = o.if_contains(key);
        if (!v) return "missing field '" + std::string(key) + "'";
        if (!v->is_string()) return "field '" + std::string(key) + "' must be a string";
        out = std::string(v->get_string());
        return std::nullopt;
    }

    std::optional<std::string> integer(std::string_view key, std::int64_t& out, bool required = true) const {
        auto* v = o.if_contains(key);
        if (!v) return required ? std::optional<std::string>("missing field '" + std::string(key) + "'") : std::nullopt;
        if (v->is_int64()) { out = v->get_int64(); return std::nullopt; }
        if (v->is_uint64()) return "field '" + std::string(key) + "' is out of range";
        return "field '" + std::string(key) + "' must be an integer";
    }

    std::optional<std::string> boolean(std::string_view key, bool& out) const {
        auto* v = o.if_contains(key);
        if (!v) return "missing field '" + std::string(key) + "'";
        if (!v->is_bool()) return "field '" + std::string(key) + "' must be true or false";
        out = v->get_bool();
        return std::nullopt;
    }

    /// A message body (send, edit): valid UTF-8 within the bounds, no U+0000.
    /// `allow_empty`: a send with attachments (contract section 12: 0-4000).
    std::optional<std::string> body(std::string& out, bool allow_empty = false) const {
        if (auto e = str("body", out)) return e;
        auto n = utf8_code_points(out);
        if (!n) return std::string("field 'body' must be valid UTF-8");
        if ((*n < b.min_body_code_points && !(allow_empty && *n == 0)) || *n > b.max_body_code_points)
            return std::string(allow_empty ? "field 'body' must be 0-4000 code points"
                                           : "field 'body' must be 1-4000 code points");
        if (out.find('\0') != std::string::npos) return std::string("field 'body' must not contain U+0000");
        return std::nullopt;
    }

    std::optional<std::string> conv(std::string& out) const {
        if (auto e = str("conv", out)) return e;
        if (!valid_id(out)) return std::string("field 'conv' must be 1-64 characters of [A-Za-z0-9._:-]");
        return std::nullopt;
    }

    std::optional<std::string> cmid(std::string& out, std::string_view key = "cmid") const {
        if (auto e = str(key, out)) return e;
        auto n = utf8_code_points(out);
        if (!n || *n < b.min_cmid_chars || *n > b.max_cmid_chars || out.find('\0') != std::string::npos)
            return "field '" + std::string(key) + "' must be 1-64 characters";
        return std::nullopt;
    }

    /// The page window shared by sync and history: optional `limit` (>= 1,
    /// cut to max_sync_limit) and optional `epoch` (any integer: one that is
    /// not the conversation's epoch, 0 included, is EPOCH_CHANGED in the store).
    std::optional<std::string> window(std::int64_t& limit, std::optional<std::int64_t>& epoch) const {
        if (auto e = integer("limit", limit, false)) return e;
        if (limit < b.min_limit) return std::string("field 'limit' must be >= 1");
        if (limit > max_sync_limit) limit = max_sync_limit;
        if (o.contains("epoch")) {
            std::int64_t ep = 0;
            if (auto e = integer("epoch", ep)) return e;
            epoch = ep;
        }
        return std::nullopt;
    }
};

std::variant<Request, Error> parse_body(std::string_view t, const json::object& o, const FieldBounds& b) {
    Fields f{o, b};
    auto bad = [](std::string m) -> std::variant<Request, Error> { return invalid(std::move(m)); };

    if (t == "hello") {
        req::Hello r;
        if (auto e = f.str("token", r.token)) return bad(*e);
        if (auto e = f.str("install", r.install)) return bad(*e);
        // An empty or over-long token is a bad credential, not a malformed
        // request: UNAUTHENTICATED and close (api.cpp), like an unknown one.
        if (!valid_id(r.install)) return bad("field 'install' must be 1-64 characters of [A-Za-z0-9._:-]");
        return r;
    }
    if (t == "send") {
        req::Send r;
        if (auto e = f.conv(r.conv)) return bad(*e);
        if (auto e = f.cmid(r.cmid)) return bad(*e);
        if (auto* a = o.if_contains("attachments")) {
            // contract section 12: 1-10 att_ids; a malformed or repeated id
            // is a malformed request (an unknown one is the store's NOT_FOUND).
            if (!a->is_array() || a->get_array().empty() || a->get_array().size() > max_message_attachments)
                return bad("field 'attachments' must be a list of 1-10 att_ids");
            for (const auto& id : a->get_array()) {
                if (!id.is_string() || !valid_att_id_text(id.get_string()))
                    return bad("field 'attachments' must hold att_ids (lowercase UUIDs)");
                std::string v(id.get_string());
                if (std::find(r.attachments.begin(), r.attachments.end(), v) != r.attachments.end())
                    return bad("field 'attachments' names an att_id twice");
                r.attachments.push_back(std::move(v));
            }
        }
        if (auto e = f.body(r.body, !r.attachments.empty())) return bad(*e);
        if (o.contains("reply_to")) {
            // Any integer: no msg has seq < 1, so the store answers NOT_FOUND.
            std::int64_t to = 0;
            if (auto e = f.integer("reply_to", to)) return bad(*e);
            r.reply_to = to;
        }
        if (o.contains("prev")) {
            if (auto e = f.cmid(r.prev, "prev")) return bad(*e);
            if (r.prev == r.cmid) return bad("field 'prev' must name another message than 'cmid'");
        }
        return r;
    }
    if (t == "sync") {
        req::Sync r;
        if (auto e = f.conv(r.conv)) return bad(*e);
        if (auto e = f.integer("after", r.after)) return bad(*e);
        if (r.after < b.min_after) return bad("field 'after' must be >= 0");
        if (auto e = f.window(r.limit, r.epoch)) return bad(*e);
        return r;
    }
    if (t == "ack" || t == "read" || t == "fetch") {
        std::string conv;
        std::int64_t seq = 0;
        if (auto e = f.conv(conv)) return bad(*e);
        if (auto e = f.integer("seq", seq)) return bad(*e);
        // Any seq: no event has seq < 1, so the store answers NOT_FOUND
        // (contract section 9 bounds only sync, history and convs).
        if (t == "fetch") return req::Fetch{std::move(conv), seq};
        if (seq < 0) return bad("field 'seq' must be >= 0");
        if (t == "ack") return req::Ack{std::move(conv), seq};
        return req::Read{std::move(conv), seq};
    }
    if (t == "recall") {
        req::Recall r;
        if (auto e = f.conv(r.conv)) return bad(*e);
        if (auto e = f.integer("target", r.target)) return bad(*e);
        if (auto e = f.cmid(r.cmid)) return bad(*e);
        return r;
    }
    if (t == "edit") {
        req::Edit r;
        if (auto e = f.conv(r.conv)) return bad(*e);
        if (auto e = f.integer("target", r.target)) return bad(*e);
        if (auto e = f.cmid(r.cmid)) return bad(*e);
        // Empty only when the target has attachments (a caption removed,
        // contract section 12): judged by the store, which knows the target.
        if (auto e = f.body(r.body, true)) return bad(*e);
        return r;
    }
    if (t == "react") {
        req::React r;
        if (auto e = f.conv(r.conv)) return bad(*e);
        if (auto e = f.integer("target", r.target)) return bad(*e);
        if (auto e = f.cmid(r.cmid)) return bad(*e);
        if (auto e = f.str("emoji", r.emoji)) return bad(*e);
        if (auto e = f.boolean("on", r.on)) return bad(*e);
        if (r.emoji.empty() || r.emoji.size() > max_emoji_bytes || !utf8_code_points(r.emoji))
            return bad("field 'emoji' must be 1-64 bytes of UTF-8");
        for (unsigned char c : r.emoji)
            if (c < 0x20 || c == 0x7F) return bad("field 'emoji' must not contain control characters");
        // C1 controls (U+0080-U+009F), encoded as 0xC2 0x80-0x9F
        for (std::size_t i = 0; i + 1 < r.emoji.size(); ++i)
            if (static_cast<unsigned char>(r.emoji[i]) == 0xC2 && static_cast<unsigned char>(r.emoji[i + 1]) >= 0x80 &&
                static_cast<unsigned char>(r.emoji[i + 1]) <= 0x9F)
                return bad("field 'emoji' must not contain control characters");
        return r;
    }
    if (t == "history") {
        req::History r;
        if (auto e = f.conv(r.conv)) return bad(*e);
        if (auto e = f.integer("before", r.before)) return bad(*e);
        if (r.before < 0) return bad("field 'before' must be >= 0");
        if (auto e = f.window(r.limit, r.epoch)) return bad(*e);
        return r;
    }
    if (t == "convs") {
        req::Convs r;
        if (o.contains("after")) {
            if (auto e = f.str("after", r.after)) return bad(*e);
            if (!r.after.empty() && !valid_id(r.after))
                return bad("field 'after' must be a conversation id (1-64 characters of [A-Za-z0-9._:-])");
        }
        if (auto e = f.integer("limit", r.limit, false)) return bad(*e);
        if (r.limit < b.min_limit) return bad("field 'limit' must be >= 1");
        if (r.limit > max_convs_limit) r.limit = max_convs_limit;
        return r;
    }
    if (t == "typing") {
        req::Typing r;
        if (auto e = f.conv(r.conv)) return bad(*e);
        auto* on = o.if_contains("on");
        if (!on) return bad("missing field 'on'");
        if (!on->is_bool()) return bad("field 'on' must be true or false");
        r.on = on->get_bool();
        return r;
    }
    if (t == "presence") {
        auto* users = o.if_contains("users");
        if (!users) return bad("missing field 'users'");
        if (!users->is_array()) return bad("field 'users' must be a list of user ids");
        const auto& a = users->get_array();
        if (a.empty() || a.size() > max_presence_users) return bad("field 'users' must list 1-500 user ids");
        req::Presence r;
        for (const auto& u : a) {
            if (!u.is_string() || !valid_id(u.get_string()))
                return bad("field 'users' must list user ids (1-64 characters of [A-Za-z0-9._:-])");
            r.users.emplace_back(u.get_string());
        }
        std::sort(r.users.begin(), r.users.end());
        r.users.erase(std::unique(r.users.begin(), r.users.end()), r.users.end());
        return r;
    }
    if (t == "sub") return req::Sub{};
    if (t == "refresh") {
        req::Refresh r;
        if (auto e = f.str("token", r.token)) return bad(*e); // any string: a bad one is UNAUTHENTICATED
        return r;
    }
    // Echoed only when short: a 64 KiB `t` must not make a reply past the
    // frame limit (an error reply is a server frame, <= 64 KiB).
    if (t.size() > max_echoed_type_bytes) return bad("unknown request type (not echoed: longer than 32 bytes)");
    return bad("unknown request type '" + std::string(t) + "'");
}

// The event encoding, written straight into the frame's text: no
// intermediate json::object per event (a page of 200 heavy events built
// and freed ~2,000 small objects, strings and arrays per request, twice:
// once to size each event for the frame budget, once for the frame; the
// profile in docs/benchmarks.md, "The heavy page, taken apart"). The bytes are
// those Boost.JSON's serializer gives for the same fields in the same
// order (keys in insertion order, its string escapes, plain integers);
// codec_test compares the two over a table of events and every byte value.

// Boost.JSON's string escapes: \" \\ \b \t \n \f \r, \u00xx (lowercase
// hex) for the other bytes below 0x20, every other byte as is.
void append_json_string(std::string& out, std::string_view s) {
    static constexpr char hex[] = "0123456789abcdef";
    out.push_back('"');
    std::size_t run = 0;
    for (std::size_t i = 0; i < s.size(); ++i) {
        const auto c = static_cast<unsigned char>(s[i]);
        if (c >= 0x20 && c != '"' && c != '\\') continue;
        out.append(s.data() + run, i - run);
        run = i + 1;
        char e = 0;
        switch (c) {
        case '"': e = '"'; break;
        case '\\': e = '\\'; break;
        case '\b': e = 'b'; break;
        case '\t': e = 't'; break;
        case '\n': e = 'n'; break;
        case '\f': e = 'f'; break;
        case '\r': e = 'r'; break;
        default: break;
        }
        if (e) {
            out.push_back('\\');
            out.push_back(e);
        } else {
            const char u[6] = {'\\', 'u', '0', '0', hex[c >> 4], hex[c & 15]};
            out.append(u, 6);
        }
    }
    out.append(s.data() + run, s.size() - run);
    out.push_back('"');
}

// One JSON object written field by field, in the order the calls come.
class ObjectWriter {
public:
    explicit ObjectWriter(std::string& out) : out_(out) { out_.push_back('{'); }
    /// The key and its colon; the caller writes the value.
    std::string& key(std::string_view k) {
        out_.append(first_ ? "\"" : ",\"", first_ ? 1 : 2);
        first_ = false;
        out_.append(k);
        out_.append("\":", 2);
        return out_;
    }
    void str(std::string_view k, std::string_view v) { append_json_string(key(k), v); }
    void num(std::string_view k, std::int64_t v) {
        key(k);
        char buf[24];
        const auto r = std::to_chars(buf, buf + sizeof buf, v);
        out_.append(buf, r.ptr);
    }
    void boolean(std::string_view k, bool v) { key(k).append(v ? "true" : "false"); }
    void null(std::string_view k) { key(k).append("null"); }
    void close() { out_.push_back('}'); }

private:
    std::string& out_;
    bool first_ = true;
};

void append_event(std::string& out, const Event& ev) {
    ObjectWriter o(out);
    o.str("conv", ev.conv);
    o.num("seq", ev.seq);
    o.str("mid", ev.mid);
    o.str("kind", ev.kind);
    // null for an event by the operator with no subject: a redaction's
    // recall (server.md, "Rate limits and moderation").
    if (ev.sender.empty()) o.null("sender");
    else o.str("sender", ev.sender);
    if (ev.body) o.str("body", *ev.body);
    if (ev.target) o.num("target", *ev.target);
    if (ev.reply_to) o.num("reply_to", *ev.reply_to);
    if (!ev.attachments.empty()) {
        std::string& a = o.key("attachments");
        a.push_back('[');
        bool first = true;
        for (const auto& x : ev.attachments) {
            if (!first) a.push_back(',');
            first = false;
            ObjectWriter item(a);
            item.str("att_id", x.att_id);
            item.str("name", x.name);
            item.str("mime", x.mime);
            item.num("size", x.size);
            item.str("sha256", x.sha256);
            item.close();
        }
        a.push_back(']');
    }
    // A user's erase: a reaction keeps its required fields (contract
    // section 12) with nothing in them: an emoji nobody has, turned off, so
    // a client that predates `erased` counts nothing for it. Where the
    // event has them they keep their place, emptied; else they follow
    // "erased".
    const bool erased_reaction = ev.erased && ev.kind == "reaction";
    if (ev.emoji) o.str("emoji", erased_reaction ? std::string_view() : std::string_view(*ev.emoji));
    if (ev.on) o.boolean("on", erased_reaction ? false : *ev.on);
    if (ev.erased) {
        o.boolean("erased", true);
        if (erased_reaction && !ev.emoji) o.str("emoji", "");
        if (erased_reaction && !ev.on) o.boolean("on", false);
    }
    if (ev.edit) {
        ObjectWriter e(o.key("edit"));
        e.num("seq", ev.edit->seq);
        e.str("body", ev.edit->body);
        e.num("ts", ev.edit->ts);
        e.close();
    }
    if (!ev.reactions.empty()) {
        std::string& a = o.key("reactions");
        a.push_back('[');
        bool first = true;
        for (const auto& r : ev.reactions) {
            if (!first) a.push_back(',');
            first = false;
            ObjectWriter item(a);
            item.str("emoji", r.emoji);
            item.num("count", r.count);
            item.boolean("me", r.me);
            item.close();
        }
        a.push_back(']');
    }
    if (ev.reactions_seq) o.num("reactions_seq", *ev.reactions_seq);
    if (ev.recalled) o.boolean("recalled", true);
    if (ev.user) o.str("user", *ev.user);
    if (ev.cmid) o.str("cmid", *ev.cmid);
    o.num("ts", ev.ts);
    o.num("epoch", ev.epoch);
    o.close();
}

// A list of events as a page carries it: [ev,ev,...].
void append_events(std::string& out, const std::vector<Event>& events) {
    out.push_back('[');
    for (std::size_t i = 0; i < events.size(); ++i) {
        if (i) out.push_back(',');
        append_event(out, events[i]);
    }
    out.push_back(']');
}

// A page's list: the text the store wrote while it took the events
// (EventListWriter) when it is there for these events, else written now.
template <class P>
void append_page_events(std::string& out, const P& x) {
    if (x.events_text_count == x.events.size() && !x.events_text.empty()) out.append(x.events_text);
    else append_events(out, x.events);
}

template <class P>
std::size_t page_frame_reserve(const P& x) {
    return 256 + x.conv.size() + (x.events_text.empty() ? x.events.size() * 256 : x.events_text.size());
}

// The frames that carry events, written straight (encode_reply).
// Both pages end alike: where the conversation stands, then the rid.
template <class P>
void close_page_frame(ObjectWriter& o, const P& x, const std::optional<std::string>& rid) {
    o.num("head", x.head);
    o.num("min_seq", x.min_seq);
    o.boolean("trimmed", x.trimmed);
    o.num("epoch", x.epoch);
    if (rid) o.str("rid", *rid);
    o.close();
}

std::string encode_page_frame(const Page& x, const std::optional<std::string>& rid) {
    std::string out;
    out.reserve(page_frame_reserve(x));
    ObjectWriter o(out);
    o.str("t", "page");
    o.str("conv", x.conv);
    append_page_events(o.key("events"), x);
    o.num("next_after", x.next_after);
    o.boolean("has_more", x.has_more);
    close_page_frame(o, x, rid);
    return out;
}

std::string encode_page_frame(const HistoryPage& x, const std::optional<std::string>& rid) {
    std::string out;
    out.reserve(page_frame_reserve(x));
    ObjectWriter o(out);
    o.str("t", "page");
    o.str("conv", x.conv);
    append_page_events(o.key("events"), x);
    o.num("oldest", x.oldest);
    o.boolean("has_older", x.has_older);
    close_page_frame(o, x, rid);
    return out;
}

std::string encode_fetched_frame(const Fetched& x, const std::optional<std::string>& rid) {
    std::string out;
    ObjectWriter o(out);
    o.str("t", "fetched");
    append_event(o.key("ev"), x.ev);
    if (rid) o.str("rid", *rid);
    o.close();
    return out;
}

json::object conv_info_json(const ConvInfo& c) {
    return json::object{{"conv", c.conv},       {"kind", c.kind},   {"head", c.head},   {"delivered", c.delivered},
                        {"read", c.read},       {"unread", c.unread}, {"epoch", c.epoch}, {"min_seq", c.min_seq}};
}

json::object presence_json(const PresenceInfo& p) {
    json::object o{{"user", p.user}, {"online", p.online}};
    if (p.last_seen) o["last_seen"] = *p.last_seen;
    else o["last_seen"] = nullptr;
    return o;
}

std::string finish(json::object o, const std::optional<std::string>& rid) {
    if (rid) o["rid"] = *rid;
    return json::serialize(o);
}

} // namespace

bool valid_att_id_text(std::string_view id) {
    if (id.size() != 36) return false;
    for (std::size_t i = 0; i < id.size(); ++i) {
        const char ch = id[i];
        if (i == 8 || i == 13 || i == 18 || i == 23) {
            if (ch != '-') return false;
        } else if (!((ch >= '0' && ch <= '9') || (ch >= 'a' && ch <= 'f'))) {
            return false;
        }
    }
    return true;
}

std::vector<AttachmentRef> attachments_from_json(std::string_view text) {
    std::vector<AttachmentRef> out;
    if (text.empty()) return out;
    json::error_code ec;
    auto v = json::parse(text, ec);
    if (ec || !v.is_array()) return out;
    for (const auto& item : v.get_array()) {
        if (!item.is_object()) return {};
        const auto& o = item.get_object();
        auto s = [&](const char* k) -> std::string {
            auto* f = o.if_contains(k);
            return f && f->is_string() ? std::string(f->get_string()) : std::string();
        };
        auto* size = o.if_contains("size");
        out.push_back({s("att_id"), s("name"), s("mime"), size && size->is_int64() ? size->get_int64() : 0, s("sha256")});
    }
    return out;
}

bool valid_id(std::string_view id) {
    if (id.empty() || id.size() > max_id_chars) return false;
    for (char c : id) {
        bool ok = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
                  c == '.' || c == '_' || c == ':' || c == '-';
        if (!ok) return false;
    }
    return true;
}

std::optional<std::size_t> utf8_code_points(std::string_view s) {
    std::size_t n = 0;
    for (std::size_t i = 0; i < s.size();) {
        auto c = static_cast<unsigned char>(s[i]);
        std::size_t len;
        std::uint32_t cp;
        if (c < 0x80) { len = 1; cp = c; }
        else if ((c & 0xE0) == 0xC0) { len = 2; cp = c & 0x1F; }
        else if ((c & 0xF0) == 0xE0) { len = 3; cp = c & 0x0F; }
        else if ((c & 0xF8) == 0xF0) { len = 4; cp = c & 0x07; }
        else return std::nullopt;
        if (i + len > s.size()) return std::nullopt;
        for (std::size_t k = 1; k < len; ++k) {
            auto cc = static_cast<unsigned char>(s[i + k]);
            if ((cc & 0xC0) != 0x80) return std::nullopt;
            cp = (cp << 6) | (cc & 0x3F);
        }
        // Reject overlong forms, surrogates and values past U+10FFFF.
        if ((len == 2 && cp < 0x80) || (len == 3 && cp < 0x800) || (len == 4 && cp < 0x10000) ||
            (cp >= 0xD800 && cp <= 0xDFFF) || cp > 0x10FFFF)
            return std::nullopt;
        i += len;
        ++n;
    }
    return n;
}

std::string_view request_name(const Request& r) {
    static constexpr std::string_view names[] = {"hello", "send", "sync", "ack", "read",
                                                 "recall", "convs", "fetch", "sub", "history", "refresh",
                                                 "edit", "react", "typing", "presence"};
    return names[r.index()];
}

Parsed parse_request(std::string_view frame, const FieldBounds& bounds) {
    Parsed p;
    json::error_code ec;
    json::value v = json::parse(frame, ec);
    if (ec || !v.is_object()) {
        p.body = invalid("frame must be one JSON object");
        return p;
    }
    const auto& o = v.get_object();
    if (auto* rid = o.if_contains("rid")) {
        if (!rid->is_string()) { p.body = invalid("field 'rid' must be a string"); return p; }
        // Characters (code points), as the contract says, not bytes.
        const auto chars = utf8_code_points(std::string_view(rid->get_string()));
        if (!chars || *chars > max_rid_chars) { p.body = invalid("field 'rid' must be at most 64 characters"); return p; }
        p.rid = std::string(rid->get_string());
    }
    auto* t = o.if_contains("t");
    if (!t || !t->is_string()) {
        p.body = invalid("missing string field 't'");
        return p;
    }
    static constexpr std::string_view known[] = {"hello", "send", "sync", "ack", "read",
                                                 "recall", "convs", "fetch", "sub", "history", "refresh",
                                                 "edit", "react", "typing", "presence"};
    std::string_view tv = t->get_string();
    p.type = "other";
    for (auto k : known)
        if (tv == k) p.type = std::string(k);
    p.body = parse_body(tv, o, bounds);
    return p;
}

std::string encode_error(const Error& e, const std::optional<std::string>& rid, std::optional<std::int64_t> retry_ms) {
    json::object o;
    o["t"] = "error";
    o["code"] = code_name(e.code);
    o["msg"] = e.msg;
    if (retry_ms) o["retry_ms"] = *retry_ms;
    return finish(std::move(o), rid);
}

std::string encode_reply(const Reply& r, const std::optional<std::string>& rid) {
    // The frames that carry events are written straight (append_event).
    if (const auto* p = std::get_if<Page>(&r)) return encode_page_frame(*p, rid);
    if (const auto* h = std::get_if<HistoryPage>(&r)) return encode_page_frame(*h, rid);
    if (const auto* f = std::get_if<Fetched>(&r)) return encode_fetched_frame(*f, rid);
    json::object o;
    std::visit(
        [&](const auto& x) {
            using T = std::decay_t<decltype(x)>;
            if constexpr (std::is_same_v<T, Welcome>) {
                o["t"] = "welcome"; o["user"] = x.user; o["device"] = x.device;
                o["gateway"] = x.gateway; o["server_time"] = x.server_time;
            } else if constexpr (std::is_same_v<T, Sent>) {
                o["t"] = "sent"; o["conv"] = x.conv; o["seq"] = x.seq; o["mid"] = x.mid;
                o["dup"] = x.dup; o["epoch"] = x.epoch;
            } else if constexpr (std::is_same_v<T, Page> || std::is_same_v<T, HistoryPage> ||
                                 std::is_same_v<T, Fetched>) {
                // written straight above
            } else if constexpr (std::is_same_v<T, Acked>) {
                o["t"] = "acked"; o["conv"] = x.conv; o["delivered"] = x.delivered;
            } else if constexpr (std::is_same_v<T, ReadOk>) {
                o["t"] = "read_ok"; o["conv"] = x.conv; o["read"] = x.read;
            } else if constexpr (std::is_same_v<T, Recalled>) {
                o["t"] = "recalled"; o["conv"] = x.conv; o["seq"] = x.seq; o["dup"] = x.dup;
            } else if constexpr (std::is_same_v<T, Edited>) {
                o["t"] = "edited"; o["conv"] = x.conv; o["seq"] = x.seq; o["dup"] = x.dup; o["epoch"] = x.epoch;
            } else if constexpr (std::is_same_v<T, Reacted>) {
                o["t"] = "reacted"; o["conv"] = x.conv;
                if (x.seq) o["seq"] = *x.seq;
                else o["seq"] = nullptr;
                o["dup"] = x.dup; o["changed"] = x.changed; o["epoch"] = x.epoch;
            } else if constexpr (std::is_same_v<T, ConvList>) {
                o["t"] = "convs";
                json::array a;
                for (const auto& c : x.convs) a.push_back(conv_info_json(c));
                o["convs"] = std::move(a);
                o["next_after"] = x.next_after; o["has_more"] = x.has_more;
            } else if constexpr (std::is_same_v<T, Subscribed>) {
                o["t"] = "subscribed";
            } else if constexpr (std::is_same_v<T, Refreshed>) {
                o["t"] = "refreshed"; o["exp"] = x.exp;
            } else if constexpr (std::is_same_v<T, TypingOk>) {
                o["t"] = "typing_ok";
            } else if constexpr (std::is_same_v<T, PresenceList>) {
                o["t"] = "presence";
                json::array a;
                a.reserve(x.users.size());
                for (const auto& p : x.users) a.push_back(presence_json(p));
                o["users"] = std::move(a);
            }
        },
        r);
    return finish(std::move(o), rid);
}

std::size_t encoded_size(const Event& ev) {
    // Written into a buffer the thread keeps: no allocation once it has
    // grown to the largest event.
    thread_local std::string scratch;
    scratch.clear();
    append_event(scratch, ev);
    return scratch.size() + 1;
}
std::size_t EventListWriter::add(const Event& ev) {
    const std::size_t start = text_.size();
    starts_.push_back(start);
    append_event(text_, ev);
    return text_.size() - start + 1;
}

void EventListWriter::drop_last() {
    if (starts_.empty()) return;
    text_.resize(starts_.back());
    starts_.pop_back();
}

std::string EventListWriter::list(bool reversed) const {
    std::string out;
    out.reserve(text_.size() + starts_.size() + 2);
    out.push_back('[');
    const std::size_t n = starts_.size();
    for (std::size_t k = 0; k < n; ++k) {
        const std::size_t i = reversed ? n - 1 - k : k;
        const std::size_t end = i + 1 < n ? starts_[i + 1] : text_.size();
        if (k) out.push_back(',');
        out.append(text_, starts_[i], end - starts_[i]);
    }
    out.push_back(']');
    return out;
}

std::size_t encoded_size(const ConvInfo& c) { return json::serialize(conv_info_json(c)).size() + 1; }

std::string encode_event_push(const Event& ev) {
    std::string out;
    ObjectWriter o(out);
    o.str("t", "event");
    append_event(o.key("ev"), ev);
    o.close();
    return out;
}

std::string encode_event(const Event& ev) {
    std::string out;
    append_event(out, ev);
    return out;
}

std::string encode_hint(std::string_view conv, std::int64_t head, std::int64_t epoch,
                        std::optional<std::int64_t> read) {
    json::object o{{"t", "hint"}, {"conv", conv}, {"head", head}, {"epoch", epoch}};
    if (read) o["read"] = *read;
    return json::serialize(o);
}

std::string encode_resync() { return json::serialize(json::object{{"t", "resync"}}); }

std::string encode_goaway(std::string_view reason, std::optional<std::int64_t> retry_ms) {
    json::object o{{"t", "goaway"}, {"reason", reason}};
    if (retry_ms) o["retry_ms"] = *retry_ms;
    return json::serialize(o);
}

std::string encode_typing_push(std::string_view conv, std::string_view user, bool on) {
    return json::serialize(json::object{{"t", "typing"}, {"conv", conv}, {"user", user}, {"on", on}});
}

std::string encode_presence_push(const PresenceInfo& p) {
    json::object o{{"t", "presence"}};
    for (auto& [k, v] : presence_json(p)) o[k] = v;
    return json::serialize(o);
}

std::string encode_token_expiring(std::int64_t exp_ms) {
    return json::serialize(json::object{{"t", "token_expiring"}, {"exp", exp_ms}});
}

} // namespace im
