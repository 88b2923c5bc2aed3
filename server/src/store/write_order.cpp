// write_in_order (store.hpp): a run of writes item by item, in order. Its
// own file because the stateful fuzz target (tests/fuzz/CMakeLists.txt)
// links it without the rest of the store (SessionStore::write_run).
#include "store/store.hpp"

#include <utility>
#include <variant>

namespace im {

namespace {

// An edit's or react's outcome in a run's shape (Store::SendResult).
Outcome<Store::SendResult> as_run_result(const Outcome<Edited>& o) {
    if (!o) return o.error();
    Store::SendResult r;
    r.sent = Sent{o->conv, o->seq, "", o->dup, o->epoch};
    return r;
}
Outcome<Store::SendResult> as_run_result(const Outcome<Reacted>& o) {
    if (!o) return o.error();
    Store::SendResult r;
    r.sent = Sent{o->conv, o->seq.value_or(0), "", o->dup, o->epoch};
    r.changed = o->changed;
    return r;
}

} // namespace

std::vector<Outcome<Store::SendResult>> write_in_order(
    const std::vector<req::Write>& run,
    const std::function<std::vector<Outcome<Store::SendResult>>(const std::vector<req::Send>&)>& sends,
    const std::function<Outcome<Edited>(const req::Edit&)>& edit,
    const std::function<Outcome<Reacted>(const req::React&)>& react) {
    std::vector<Outcome<Store::SendResult>> out;
    out.reserve(run.size());
    for (std::size_t i = 0; i < run.size();) {
        if (std::holds_alternative<req::Send>(run[i])) {
            std::vector<req::Send> stretch;
            for (; i < run.size() && std::holds_alternative<req::Send>(run[i]); ++i)
                stretch.push_back(std::get<req::Send>(run[i]));
            auto part = sends(stretch);
            if (part.empty()) return {};
            for (auto& o : part) out.push_back(std::move(o));
            continue;
        }
        if (const auto* e = std::get_if<req::Edit>(&run[i])) out.push_back(as_run_result(edit(*e)));
        else out.push_back(as_run_result(react(std::get<req::React>(run[i]))));
        ++i;
    }
    return out;
}

} // namespace im
