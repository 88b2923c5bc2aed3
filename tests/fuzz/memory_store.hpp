// An in-memory model of the contract's storage, behind the request
// handler's SessionStore seam (server/src/store/session_store.hpp), for the
// stateful fuzz target fuzz_session. It keeps the rules a session can see
// (contract sections 4-6, docs/protocol.md's decisions), not PostgreSQL's
// mechanics: no SQL, no locks, no revocation, one thread. A model, so it is
// short and obvious rather than fast.
//
// What it keeps: one event per request key (conv, sender, cmid), a repeat
// answered with the original seq and mid and dup:true, another fingerprint
// IDEMPOTENCY_MISMATCH; seqs dense per conversation from 1; membership
// periods and read access by seq; NOT_MEMBER alike for an unknown
// conversation and one without a period (C4); `prev` (docs/protocol.md,
// "Send"); recall of own messages within the window by its own clock;
// retention purge with tombstones (ORIGINAL_EXPIRED) and min_seq; sync and
// history pages cut by limit and by frame size, with has_more/has_older and
// cursors; delivery and read markers that never go down; installs
// (STALE_INSTALL).
#pragma once

#include "store/session_store.hpp"

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace im::fuzz {

class MemoryStore final : public SessionStore {
public:
    // ---- set-up and what other parties do (the admin CLI, other users)
    void add_device(const std::string& user, const std::string& device, const std::string& token);
    /// A conversation with these members (each a join event, in order).
    void add_conv(const std::string& conv, const std::string& kind, const std::vector<std::string>& members);
    void join(const std::string& conv, const std::string& user);
    void leave(const std::string& conv, const std::string& user);
    /// Retention: events below `before` go, their keys become tombstones.
    void purge(const std::string& conv, std::int64_t before);
    void set_recall_window(const std::string& conv, std::int64_t ms);
    /// The model's clock (the database clock of `ts` and the recall window), ms.
    std::int64_t now_ms = 1'764'633'600'000;
    /// The stored event, or nullptr (unknown, purged): for checks of what a
    /// gateway hands its own subscribers.
    const Event* stored(const std::string& conv, std::int64_t seq) const;

    // ---- SessionStore
    Outcome<Identity> hello(const req::Hello& r) override;
    Outcome<Identity> hello_jwt(const std::string& user, const std::string& device, const std::string& install,
                                std::int64_t exp_ms) override;
    std::vector<Outcome<Store::SendResult>> send_run(const Identity& who, const std::vector<req::Send>& run) override;
    Outcome<Page> sync(const Identity& who, const req::Sync& r) override;
    Outcome<Fetched> fetch(const Identity& who, const req::Fetch& r) override;
    Outcome<HistoryPage> history(const Identity& who, const req::History& r) override;
    Outcome<ConvList> convs(const Identity& who, const req::Convs& r) override;
    Outcome<Acked> ack(const Identity& who, const req::Ack& r) override;
    Outcome<ReadOk> read(const Identity& who, const req::Read& r, Notes& notes) override;
    Outcome<Recalled> recall(const Identity& who, const req::Recall& r) override;
    // The model has no edits or reactions yet (contract section 12): refused.
    Outcome<Edited> edit(const Identity&, const req::Edit&) override { return invalid("the model has no edits"); }
    Outcome<Reacted> react(const Identity&, const req::React&) override { return invalid("the model has no reactions"); }

private:
    struct Period {
        std::int64_t from, to; // to = INT64_MAX while open
    };
    struct Access {
        std::vector<Period> periods;
        bool open = false;
        std::int64_t head = 0; // the highest seq this user may know of
        bool any() const { return !periods.empty(); }
        bool can_read(std::int64_t seq) const;
    };
    using Key = std::pair<std::string, std::string>; // (sender, cmid)
    struct Keyed {
        std::int64_t seq;
        std::string fingerprint;
    };
    struct Conv {
        std::string kind;
        std::int64_t next_seq = 1, epoch = 1, min_seq = 1, recall_window_ms = 120000;
        std::map<std::int64_t, Event> events;                  // by seq, from min_seq
        std::map<std::string, std::vector<Period>> periods;    // by user, ascending
        std::map<Key, Keyed> keys, tombstones;
        std::map<std::string, std::int64_t> read;              // by user
        std::map<std::string, std::int64_t> delivered;         // by device
        std::set<std::int64_t> recalled;                       // targets of recall events
    };
    struct Device {
        std::string user, token, install; // install: the current one ("" before the first hello)
        std::vector<std::string> superseded;
    };

    Conv* find(const std::string& conv);
    struct Visible {
        Conv* conv;
        Access access;
    };
    /// The conversation and the caller's periods: NOT_MEMBER for an unknown
    /// one and one without a period (C4); EPOCH_CHANGED when `epoch` is given and old.
    Outcome<Visible> visible(const Identity& who, const std::string& conv, std::optional<std::int64_t> epoch);
    Access access(const Conv& c, const std::string& user) const;
    Event& append(Conv& c, const std::string& conv, Event ev);
    /// Registers `who.install` (a new one supersedes the others): STALE_INSTALL for a superseded one.
    Outcome<Identity> with_install(Identity who);
    /// ack's and read's checks, in their order; the conversation when they pass.
    Outcome<Conv*> marker(const Identity& who, const std::string& conv, std::int64_t seq);

    std::map<std::string, Conv> convs_;
    std::map<std::string, Device> devices_; // by device id
    std::set<std::string> users_;
    std::int64_t mids_ = 0;
};

} // namespace im::fuzz
