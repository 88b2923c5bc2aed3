#include "store/lab_schema.hpp"

#include "core/log.hpp"
#include "store/migrations.hpp"

#include <cctype>
#include <stdexcept>
#include <string_view>
#include <utility>
#include <vector>

namespace im {

namespace {

struct Edit {
    std::string_view from, to;
};

struct Variant {
    std::string_view point; // the fault point that selects it ("" for no_lock)
    std::string_view name;  // im_lab_send_<name>
    std::vector<Edit> edits;
};

const std::vector<Variant>& variants() {
    static const std::vector<Variant> list = {
        // a stranger (no period, or no open one) may write (C4)
        {"rule.send_membership", "send_membership",
         {{"         WHERE EXISTS (SELECT 1 FROM membership_periods m WHERE m.conv_id = r.conv AND m.user_id = r.usr OFFSET 0)\n",
           ""},
          {"IF NOT k.open THEN", "IF false THEN"}}},
        // an unknown conversation answers apart from a non-member (C4: no
        // existence oracle): UNAUTHENTICATED, a code production im_send
        // also returns, so the gateway needs no lab-only result code
        {"rule.same_error", "same_error",
         {{"            run_code[g] := 'NOT_MEMBER';",
           "            run_code[g] := CASE WHEN EXISTS (SELECT 1 FROM conversations cv WHERE cv.conv_id = p_convs[g]) "
           "THEN 'NOT_MEMBER' ELSE 'UNAUTHENTICATED' END;"}}},
        // a reused cmid is a duplicate whatever its body (C1)
        {"rule.request_hash", "request_hash",
         {{"IF k.o_hash = k.fp THEN", "IF true THEN"}, {"IF a_fp[j] = k.fp THEN", "IF true THEN"}}},
        // a fresh append is answered dup:true
        {"rule.fresh_dup", "fresh_dup", {{"a_dup[k.i] := false;", "a_dup[k.i] := true;"}}},
        // the fingerprint of conv and body only: the same cmid with another
        // reply_to is a duplicate (contract section 12, the seed's warning)
        {"rule.fingerprint_body_only", "fingerprint_body_only",
         {{"CASE WHEN u.reply_to IS NULL\n", "CASE WHEN true\n"}}},
        // a send is appended though the message its `prev` names is not
        {"rule.send_prev", "send_prev",
         {{"IF NOT (k.prev_ok OR key_new[k.prev_at] IS NOT NULL) THEN", "IF false THEN"}}},
        // the request-key lookup skipped: a repeated (conv, sender, cmid) is
        // judged as a fresh send and inserts a second event (C1; with
        // events_idempotency in place the second insert meets the index)
        {"rule.send_dedup", "send_dedup",
         {{"IF k.o_seq IS NOT NULL THEN", "IF false THEN"}, {"IF j IS NOT NULL THEN", "IF false THEN"}}},
        // a muted member's send is appended (server.md, moderation; 14-mute-redact-erase's control)
        {"rule.send_mute", "send_mute", {{"IF k.muted THEN", "IF false THEN"}}},
        // --lab-no-unique-index: check-then-insert without the row lock (the
        // counters' UPDATE takes it only after the keys were checked)
        {"", "no_lock",
         {{"FOR NO KEY UPDATE OF cv SKIP LOCKED FOR SHARE OF d", "FOR SHARE OF d"},
          {"        CONTINUE WHEN NOT pg_try_advisory_xact_lock(im_conv_gate_key(p_convs[k.g]));\n", ""}}},
    };
    return list;
}

void replace_once(std::string& sql, std::string_view from, std::string_view to, std::string_view variant) {
    const auto at = sql.find(from);
    if (at == std::string::npos || sql.find(from, at + 1) != std::string::npos)
        throw std::runtime_error("lab variant " + std::string(variant) + ": the production SQL no longer has '" +
                                 std::string(from) + "' exactly once");
    sql.replace(at, from.size(), to);
}

// The variants of im_change (schema/functions/im_change.sql, edit and
// react), im_lab_change_<name>, selected by Store::edit/react; their edits
// fall in im_change_items, which the variant carries renamed.
const std::vector<Variant>& change_variants() {
    static const std::vector<Variant> list = {
        // an edit is judged without its window (contract section 12)
        {"rule.edit_window", "edit_window",
         {{"IF k.kind = 'edit' AND (k.edit_window_ms = 0", "IF false AND (k.edit_window_ms = 0"}}},
        // a reaction already as asked appends an event anyway
        {"rule.react_noop", "react_noop",
         {{"IF (c_has AND c_on = k.on_) OR (NOT c_has AND NOT k.on_) THEN", "IF false THEN"}}},
    };
    return list;
}

// `base` is the production function (im_send, im_change), `prefix` its
// variants' (im_lab_send_, im_lab_change_).
std::string variant_sql(const Variant& v, std::string_view base, std::string_view prefix) {
    std::string sql;
    for (const auto& f : all_functions())
        if (f.name == base) sql = f.sql;
    if (sql.empty()) throw std::runtime_error("schema/functions/" + std::string(base) + ".sql is not embedded");
    replace_once(sql, "FUNCTION " + std::string(base) + "(", "FUNCTION " + std::string(prefix) + std::string(v.name) + "(",
                 v.name);
    // The file's other functions (im_send.sql's im_lock_runs, im_change.sql's
    // im_write_group): renamed in the variant, definition and calls, so the
    // variant is self-contained and never replaces a production function
    // (its edits may fall in one of them: the no_lock variant's do).
    static constexpr std::string_view create = "CREATE OR REPLACE FUNCTION ";
    std::vector<std::string> helpers;
    for (auto at = sql.find(create); at != std::string::npos; at = sql.find(create, at + 1)) {
        const auto from = at + create.size();
        const auto name = sql.substr(from, sql.find('(', from) - from);
        if (name.rfind(prefix, 0) != 0) helpers.push_back(name);
    }
    for (const auto& h : helpers) {
        const std::string from = h + "(", to = std::string(prefix) + std::string(v.name) + "_" + h + "(";
        std::size_t pos = 0;
        while ((pos = sql.find(from, pos)) != std::string::npos) {
            const bool longer = pos > 0 && (std::isalnum(static_cast<unsigned char>(sql[pos - 1])) || sql[pos - 1] == '_');
            if (longer) { // part of a longer name: not this function
                pos += from.size();
                continue;
            }
            sql.replace(pos, from.size(), to);
            pos += to.size();
        }
    }
    for (const auto& e : v.edits) replace_once(sql, e.from, e.to, v.name);
    return sql;
}

} // namespace

std::string lab_rule_off(std::string sql, std::string_view rule, std::string_view off, std::string_view variant) {
    replace_once(sql, rule, off, variant);
    return sql;
}

void install_lab_send_functions(pqxx::connection_base& c) {
    pqxx::work tx(c);
    lock_schema(tx); // gateways of one lab start together
    for (const auto& v : variants()) tx.exec(variant_sql(v, "im_send", "im_lab_send_"));
    for (const auto& v : change_variants()) tx.exec(variant_sql(v, "im_change", "im_lab_change_"));
    tx.commit();
    log_warn("lab_send_functions_installed", {{"count", static_cast<int>(variants().size() + change_variants().size())}});
}

std::string lab_send_function(FaultRegistry& faults, bool no_lock) {
    std::string chosen = no_lock ? "no_lock" : "";
    for (const auto& v : variants()) {
        if (v.point.empty() || !faults.broken(v.point)) continue;
        if (!chosen.empty()) throw std::runtime_error("lab: one broken send rule at a time (" + chosen + ", " +
                                                      std::string(v.name) + ")");
        chosen = v.name;
    }
    return chosen.empty() ? std::string("im_send") : "im_lab_send_" + chosen;
}

std::string lab_change_function(FaultRegistry& faults) {
    for (const auto& v : change_variants())
        if (faults.broken(v.point)) return "im_lab_change_" + std::string(v.name);
    return "im_change";
}

} // namespace im
