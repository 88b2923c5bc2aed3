// What one session's requests need from storage: the request handler's
// (api.hpp) only door to the database. One call per request, each a contract
// outcome, the same as Store's (store.hpp documents the rules).
//
// Production uses PgSessionStore, the Store on one pooled connection. The
// seam exists so the handler can also run against an in-memory model of the
// contract (tests/fuzz/memory_store.hpp, the stateful fuzz target), without
// PostgreSQL; a nullptr SessionStore means "the database is unreachable".
#pragma once

#include "core/protocol.hpp"
#include "store/store.hpp"

#include <cstdint>
#include <string>
#include <vector>

namespace im {

class SessionStore {
public:
    virtual ~SessionStore() = default;
    virtual Outcome<Identity> hello(const req::Hello& r) = 0;
    /// hello with a verified JWT's claims (Store::hello_jwt).
    virtual Outcome<Identity> hello_jwt(const std::string& user, const std::string& device,
                                        const std::string& install, std::int64_t exp_ms) = 0;
    /// A run of one connection's sends to one conversation (Store::send_run):
    /// EMPTY when the conversation's row was held and nothing was written.
    virtual std::vector<Outcome<Store::SendResult>> send_run(const Identity& who,
                                                             const std::vector<req::Send>& run) = 0;
    /// A run of one connection's writes to one conversation (sends, edits,
    /// reacts; Store::send_group with one run): EMPTY as send_run's. This
    /// default goes item by item (send_run for a stretch of sends,
    /// edit/react for a change), in order: a model's.
    virtual std::vector<Outcome<Store::SendResult>> write_run(const Identity& who,
                                                              const std::vector<req::Write>& run);
    virtual Outcome<Page> sync(const Identity& who, const req::Sync& r) = 0;
    virtual Outcome<Fetched> fetch(const Identity& who, const req::Fetch& r) = 0;
    virtual Outcome<HistoryPage> history(const Identity& who, const req::History& r) = 0;
    virtual Outcome<ConvList> convs(const Identity& who, const req::Convs& r) = 0;
    virtual Outcome<Acked> ack(const Identity& who, const req::Ack& r) = 0;
    /// `notes`: the bus payloads to publish after the commit (a moved marker).
    virtual Outcome<ReadOk> read(const Identity& who, const req::Read& r, Notes& notes) = 0;
    virtual Outcome<Recalled> recall(const Identity& who, const req::Recall& r) = 0;
    /// Contract section 12 (Store::edit, Store::react): committed on return.
    virtual Outcome<Edited> edit(const Identity& who, const req::Edit& r) = 0;
    virtual Outcome<Reacted> react(const Identity& who, const req::React& r) = 0;
    /// Contract section 13 (Store::typing_gate, Store::presence). A model
    /// without presence answers UNAVAILABLE and an empty list.
    virtual Outcome<bool> typing_gate(const Identity&, const std::string&) { return unavailable("no typing here"); }
    virtual Outcome<PresenceList> presence(const Identity&, const std::vector<std::string>&) { return PresenceList{}; }
};

/// The production SessionStore: the Store's transactions on one connection
/// (a database worker's, borrowed for one request).
class PgSessionStore final : public SessionStore {
public:
    PgSessionStore(Store& store, pqxx::connection_base& c) : store_(store), c_(c) {}
    Outcome<Identity> hello(const req::Hello& r) override { return store_.hello(c_, r); }
    Outcome<Identity> hello_jwt(const std::string& user, const std::string& device, const std::string& install,
                                std::int64_t exp_ms) override {
        return store_.hello_jwt(c_, user, device, install, exp_ms);
    }
    std::vector<Outcome<Store::SendResult>> send_run(const Identity& who, const std::vector<req::Send>& run) override {
        return store_.send_run(c_, who, run);
    }
    std::vector<Outcome<Store::SendResult>> write_run(const Identity& who,
                                                      const std::vector<req::Write>& run) override {
        return std::move(store_.send_group(c_, {Store::SendRun{&who, &run}}).front());
    }
    Outcome<Page> sync(const Identity& who, const req::Sync& r) override { return store_.sync(c_, who, r); }
    Outcome<Fetched> fetch(const Identity& who, const req::Fetch& r) override { return store_.fetch(c_, who, r); }
    Outcome<HistoryPage> history(const Identity& who, const req::History& r) override {
        return store_.history(c_, who, r);
    }
    Outcome<ConvList> convs(const Identity& who, const req::Convs& r) override { return store_.convs(c_, who, r); }
    Outcome<Acked> ack(const Identity& who, const req::Ack& r) override { return store_.ack(c_, who, r); }
    Outcome<ReadOk> read(const Identity& who, const req::Read& r, Notes& notes) override {
        return store_.read(c_, who, r, notes);
    }
    Outcome<Recalled> recall(const Identity& who, const req::Recall& r) override { return store_.recall(c_, who, r); }
    Outcome<Edited> edit(const Identity& who, const req::Edit& r) override { return store_.edit(c_, who, r); }
    Outcome<Reacted> react(const Identity& who, const req::React& r) override { return store_.react(c_, who, r); }
    Outcome<bool> typing_gate(const Identity& who, const std::string& conv) override {
        return store_.typing_gate(c_, who, conv);
    }
    Outcome<PresenceList> presence(const Identity& who, const std::vector<std::string>& users) override {
        return store_.presence(c_, who, users);
    }

private:
    Store& store_;
    pqxx::connection_base& c_;
};

inline std::vector<Outcome<Store::SendResult>> SessionStore::write_run(const Identity& who,
                                                                      const std::vector<req::Write>& run) {
    return write_in_order(
        run, [&](const std::vector<req::Send>& sends) { return send_run(who, sends); },
        [&](const req::Edit& e) { return edit(who, e); }, [&](const req::React& r) { return react(who, r); });
}

} // namespace im
