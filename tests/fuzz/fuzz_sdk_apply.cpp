// libFuzzer target: the SDK's apply path, stateful (issue 25 item 7). One
// input is a sequence of operations on ONE real im::detail::Storage over a
// real SQLite file (a file in a temporary folder, /dev/shm when there is
// one: the store needs WAL, which ":memory:" cannot do, so a file is the
// only way to run the code path the SDK runs). Beside it runs a small
// server (each conversation's events per epoch, purges with tombstones,
// restores that change the epoch) whose answers are written as JSON frames
// and read back through the SDK's real decoder (proto::decode), and a model
// of what the store must show. After every operation what it can have
// changed is checked against the model; a violation prints the operations
// so far and aborts (a crash input for libFuzzer).
//
// Operations (one letter, then argument bytes; see docs/acceptance.md,
// "Fuzzing"). An argument byte that is a digit counts as its value, so the
// kept seeds in regressions/sdk_apply/ are readable; space, newlines and
// `#` comments between operations are skipped. Any other byte is an
// operation by its value modulo the number of operations.
//   e c        enqueue a send in conversation c (Storage::enqueue)
//   r c i      enqueue a recall of the i-th event of c
//   o c        another user sends a message in c (server only)
//   x c i      the other user recalls their i-th message (server only)
//   a i m      the outbox entry i reaches the server; m: 0 answered,
//              1 the answer is lost, 2 UNAVAILABLE (nothing written)
//   p c l      sync c now (limit l + 1): request, answer, apply
//   q c l      sync c, the answer is kept in flight (w / d deliver it)
//   h c l      the newest history window of c now (before = 0)
//   w c l      the same, kept in flight
//   g c i l    an older window filling gap i of c, kept in flight
//   d c k      deliver what is in flight for c (k odd: the older window)
//   u c n ...  n + 1 pushed events, each `s v`: s picks which one (the
//              next, the newest, any, a repeat, one of the last epoch)
//   f          flush: the outbox's batched answers and own events are
//              written (Outbox::flush)
//   k          restart: close the store and open it again on the same
//              file; what was in flight or batched in memory is lost
//   E c n      the server is restored: new epoch, its first n events kept
//   t c n      the server purges c's n oldest events (tombstones)
//
// What the harness does between the decoder and the store mirrors the
// SDK's layer above it, which needs a connection and an event loop:
// Sync::onPage / onWindow / onOlder / onSyncFailed / applyPushes (which
// call to make, the epoch checks before a page, the resets on
// EPOCH_CHANGED / CURSOR_AHEAD) and Outbox::onOutcome / settleOwnEvents /
// flush (which answers become Storage::Finish / Retry rows).
//
// Checked after every operation (the conversation it names, the outbox):
//   * the timeline (Storage::messages) shows no message twice (no key twice),
//     and every Pending / Failed / Expired draft exactly once;
//   * every stored event is the server's event at that (conv, seq) in its
//     epoch, and of the conversation's epoch (no event of a void epoch);
//   * the cursor: within one epoch it never moves backwards; the epoch only
//     goes from none to one (a page, a newest window) or back to none (the
//     reset after EPOCH_CHANGED / CURSOR_AHEAD); it never passes the
//     server's head, nor an event that is neither stored, nor in a gap,
//     nor trimmed (gap_to), nor purged on the server;
//   * the outbox (Storage::loadOutbox, also right after a restart) holds
//     exactly the drafts the model has Pending, in creation order, with
//     their attempts; each draft's local state matches the model, and a
//     Sent / Failed / Expired draft is never answered again, except that
//     the rebuild after a restore puts our Sent messages above the new
//     head back at the end of the outbox (Storage::requeueLostOwn: exactly
//     the ones the model expects, checked against Storage::takeRequeued);
//   * after a flush, every own event stored in that run settled its draft
//     with the event's seq (Sent);
//   * a message that a stored recall event targets reads as Recalled.
#include "codec_p.h"
#include "storage_p.h"

#include <im/types.h>

#include <QtCore/QCoreApplication>
#include <QtCore/QDir>
#include <QtCore/QFile>
#include <QtCore/QJsonArray>
#include <QtCore/QJsonDocument>
#include <QtCore/QJsonObject>
#include <QtCore/QSet>
#include <QtCore/QTemporaryDir>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <utility>

using im::MessageState;
using im::detail::Storage;
using im::proto::Event;
using im::proto::Incoming;
using im::proto::Page;

namespace {

constexpr int NConvs = 2;
constexpr int AllConvs = NConvs;
constexpr int MaxOps = 96;
const QString Self = QStringLiteral("me");
const QString Other = QStringLiteral("bob");

QString convName(int c) { return QStringLiteral("c%1").arg(c); }

// ------------------------------------------------------------------ input

class Input {
public:
    Input(const std::uint8_t *data, std::size_t size) : p_(data), end_(data + size) {}
    // The next operation byte, or -1 at the end.
    int op() {
        while (p_ < end_) {
            const std::uint8_t b = *p_;
            if (b == ' ' || b == '\n' || b == '\r' || b == '\t') {
                ++p_;
            } else if (b == '#') {
                while (p_ < end_ && *p_ != '\n')
                    ++p_;
            } else {
                ++p_;
                return b;
            }
        }
        return -1;
    }
    // An argument in [0, range): a digit counts as its value.
    int arg(int range) {
        while (p_ < end_ && *p_ == ' ')
            ++p_;
        if (p_ == end_)
            return 0;
        const std::uint8_t b = *p_++;
        const int v = (b >= '0' && b <= '9') ? b - '0' : b;
        return v % range;
    }

private:
    const std::uint8_t *p_, *end_;
};

// ------------------------------------------------------------------ server

struct ServerConv {
    qint64 epoch = 1;
    std::map<qint64, QList<Event>> log; // by epoch: every event written in it (seq = index + 1)
    std::map<qint64, qint64> minSeq;    // by epoch: the lowest seq not purged
    QSet<QString> tombstones;           // request keys of purged events
    QList<Event> &cur() { return log[epoch]; }
    qint64 head() { return cur().size(); }
    qint64 min() { return minSeq.emplace(epoch, 1).first->second; }
};

QJsonObject eventJson(const Event &e) {
    QJsonObject o{{QStringLiteral("conv"), e.conv}, {QStringLiteral("seq"), e.seq}, {QStringLiteral("mid"), e.mid},
                  {QStringLiteral("kind"), e.kind},  {QStringLiteral("sender"), e.sender},
                  {QStringLiteral("ts"), e.ts},      {QStringLiteral("epoch"), e.epoch}};
    if (!e.body.isEmpty())
        o.insert(QStringLiteral("body"), e.body);
    if (e.kind == u"recall")
        o.insert(QStringLiteral("target"), e.target);
    if (!e.cmid.isEmpty())
        o.insert(QStringLiteral("cmid"), e.cmid);
    return o;
}

QByteArray frame(const QJsonObject &o) { return QJsonDocument(o).toJson(QJsonDocument::Compact); }

QByteArray errorFrame(const char *code) {
    return frame({{QStringLiteral("t"), QStringLiteral("error")}, {QStringLiteral("rid"), QStringLiteral("r")},
                  {QStringLiteral("code"), QLatin1String(code)}, {QStringLiteral("msg"), QStringLiteral("fuzz")}});
}

// ------------------------------------------------------------------ harness

struct Entry {
    QString cmid, conv, kind;
    qint64 target = 0;
    MessageState state = MessageState::Pending;
    qint64 seq = 0;
    int attempts = 0;
    qint64 order = 0; // its place in the outbox (a requeued entry goes to the end)
};

// A request whose answer is in flight: the frame the server answered with.
struct InFlight {
    enum Kind { Sync, Newest, Older } kind = Sync;
    qint64 after = 0;             // Sync: the cursor it was asked from
    qint64 gapLo = 0;             // Newest / Older: the gap's low end
    qint64 before = 0;            // Older
    qint64 epoch = 0;             // the epoch it was asked under (0: none)
    QByteArray answer;
};

struct Seen {
    qint64 epoch = 0, after = 0;
};

class Harness {
public:
    explicit Harness(const QString &path) : path_(path) {}
    void run(Input &in);

private:
    [[noreturn]] void violated(const QString &what);
    void must(bool ok, const char *what) {
        if (!ok)
            violated(QStringLiteral("storage call failed: %1: %2").arg(QLatin1String(what), store_->lastError()));
    }
    void open();
    Incoming decoded(const QByteArray &f);
    std::optional<im::detail::ConvRow> conv(int c) { return store_->conversation(convName(c)); }
    im::detail::ConvRow ensure(int c);

    // Client operations.
    void enqueue(int c, const QString &kind, qint64 target);
    void attempt(int i, int mode);
    InFlight request(int c, InFlight::Kind kind, int limit, int gap);
    void deliver(int c, const InFlight &f);
    void push(int c, Input &in);
    void flush();
    void restart();
    // Server operations.
    void otherSends(int c);
    void otherRecalls(int c, int i);
    void restore(int c, int keep);
    void purge(int c, int n);
    QByteArray serverAnswer(const Entry &e);
    QByteArray page(int c, qint64 after, std::optional<qint64> epoch, int limit);
    QByteArray window(int c, qint64 before, std::optional<qint64> epoch, int limit);
    Event append(int c, const QString &kind, const QString &sender, const QString &cmid, qint64 target);

    // Mirrors of the layer above the store.
    void resetConversation(int c, bool dropEvents);
    void onSyncFailed(int c, const Incoming &reply);
    void ownEventsStored(const QList<Event> &events);
    void onOutcome(const QString &cmid, const Incoming &reply);
    void requeueLost(int c, qint64 head);

    // Checks the outbox (if `outbox`) and conversation `conv` (AllConvs: every one; -1: none).
    void check(bool outbox, int conv);
    void checkConv(int c);

    QString path_;
    std::unique_ptr<Storage> store_;
    std::array<ServerConv, NConvs> server_;
    QList<Entry> entries_;
    QHash<QString, qint64> index_;                 // cmid -> entries_ index
    std::array<std::optional<InFlight>, NConvs> sync_, older_;
    QList<Storage::Finish> finished_;              // Outbox::finished_: answers not written yet
    QList<Storage::Retry> retries_;
    QSet<QString> settling_;                       // cmids in finished_
    QList<Event> ownStored_;                       // own events applied since the last flush
    std::array<Seen, NConvs> seen_;
    std::array<bool, NConvs> reset_{};
    qint64 clock_ = 1000;
    int counter_ = 0;
    qint64 order_ = 0;
    QStringList trace_;
};

void Harness::violated(const QString &what) {
    std::fprintf(stderr, "fuzz_sdk_apply: VIOLATION: %s\n  operations:\n", qPrintable(what));
    for (const QString &t : std::as_const(trace_))
        std::fprintf(stderr, "    %s\n", qPrintable(t));
    std::abort();
}

void Harness::open() {
    store_ = std::make_unique<Storage>();
    if (!store_->open(path_))
        violated(QStringLiteral("cannot open the store: %1").arg(store_->lastError()));
}

Incoming Harness::decoded(const QByteArray &f) {
    QString error;
    const std::optional<Incoming> in = im::proto::decode(f, &error);
    if (!in)
        violated(QStringLiteral("the decoder refused a server frame: %1: %2").arg(error, QString::fromUtf8(f)));
    return *in;
}

im::detail::ConvRow Harness::ensure(int c) {
    // Sync::launch: a conversation the store does not know is created first.
    std::optional<im::detail::ConvRow> row = conv(c);
    if (!row) {
        must(store_->ensureConversation(convName(c)), "ensureConversation");
        row = conv(c);
        if (!row)
            violated(QStringLiteral("conversation %1 missing after ensureConversation").arg(c));
    }
    return *row;
}

// ------------------------------------------------------------------ server side

Event Harness::append(int c, const QString &kind, const QString &sender, const QString &cmid, qint64 target) {
    ServerConv &s = server_[c];
    Event e;
    e.conv = convName(c);
    e.seq = s.head() + 1;
    e.mid = QStringLiteral("mid-%1").arg(++counter_);
    e.kind = kind;
    e.sender = sender;
    if (kind == u"msg")
        e.body = QStringLiteral("body %1").arg(counter_);
    e.target = target;
    e.ts = clock_;
    e.epoch = s.epoch;
    e.cmid = cmid;
    s.cur().append(e);
    return e;
}

void Harness::otherSends(int c) { append(c, QStringLiteral("msg"), Other, QStringLiteral("bob-%1").arg(counter_), 0); }

void Harness::otherRecalls(int c, int i) {
    ServerConv &s = server_[c];
    QList<qint64> theirs;
    for (const Event &e : s.cur())
        if (e.kind == u"msg" && e.sender == Other && e.seq >= s.min())
            theirs.append(e.seq);
    if (theirs.isEmpty())
        return;
    const qint64 t = theirs.at(i % theirs.size());
    for (const Event &e : s.cur())
        if (e.kind == u"recall" && e.target == t)
            return; // ALREADY_RECALLED
    append(c, QStringLiteral("recall"), Other, QStringLiteral("bob-%1").arg(counter_), t);
}

void Harness::restore(int c, int keep) {
    // A restore from a backup: a new epoch holding the first `keep` events.
    ServerConv &s = server_[c];
    const qint64 oldMin = s.min();
    QList<Event> kept = s.cur().mid(0, std::min<qsizetype>(keep, s.cur().size()));
    ++s.epoch;
    for (Event &e : kept)
        e.epoch = s.epoch;
    s.log[s.epoch] = kept;
    s.minSeq[s.epoch] = std::min<qint64>(oldMin, kept.size() + 1);
}

void Harness::purge(int c, int n) {
    ServerConv &s = server_[c];
    const qint64 to = std::min<qint64>(s.min() + n, s.head() + 1);
    for (const Event &e : s.cur())
        if (e.seq < to && e.sender == Self && !e.cmid.isEmpty())
            s.tombstones.insert(e.cmid);
    s.minSeq[s.epoch] = to;
}

QByteArray Harness::serverAnswer(const Entry &en) {
    // Contract section 6, "send" (and recall): the key, then the tombstone,
    // then the checks, then the append.
    const int c = en.conv.mid(1).toInt();
    ServerConv &s = server_[c];
    const bool recall = en.kind == u"recall";
    auto reply = [&](const Event &e, bool dup) {
        QJsonObject o{{QStringLiteral("t"), recall ? QStringLiteral("recalled") : QStringLiteral("sent")},
                      {QStringLiteral("rid"), QStringLiteral("r")}, {QStringLiteral("conv"), e.conv},
                      {QStringLiteral("seq"), e.seq}, {QStringLiteral("dup"), dup}};
        if (!recall) {
            o.insert(QStringLiteral("mid"), e.mid);
            o.insert(QStringLiteral("epoch"), e.epoch);
        }
        return frame(o);
    };
    for (const Event &e : s.cur())
        if (e.seq >= s.min() && e.sender == Self && e.cmid == en.cmid)
            return reply(e, true);
    if (s.tombstones.contains(en.cmid))
        return errorFrame("ORIGINAL_EXPIRED");
    if (recall) {
        const qint64 t = en.target;
        if (t < s.min() || t > s.head())
            return errorFrame("NOT_FOUND");
        const Event &target = s.cur().at(t - 1);
        if (target.kind != u"msg")
            return errorFrame("NOT_FOUND");
        if (target.sender != Self)
            return errorFrame("NOT_SENDER");
        for (const Event &e : s.cur())
            if (e.kind == u"recall" && e.target == t)
                return errorFrame("ALREADY_RECALLED");
        return reply(append(c, QStringLiteral("recall"), Self, en.cmid, t), false);
    }
    return reply(append(c, QStringLiteral("msg"), Self, en.cmid, 0), false);
}

QByteArray Harness::page(int c, qint64 after, std::optional<qint64> epoch, int limit) {
    // Contract section 6, "sync" (server/src/store/store_reads.cpp, Store::sync).
    ServerConv &s = server_[c];
    if (epoch && *epoch != s.epoch)
        return errorFrame("EPOCH_CHANGED");
    if (after > s.head())
        return errorFrame("CURSOR_AHEAD");
    QJsonArray events;
    qint64 last = 0;
    bool more = false;
    for (qint64 seq = std::max(after + 1, s.min()); seq <= s.head(); ++seq) {
        if (events.size() == limit) {
            more = true;
            break;
        }
        events.append(eventJson(s.cur().at(seq - 1)));
        last = seq;
    }
    return frame({{QStringLiteral("t"), QStringLiteral("page")}, {QStringLiteral("rid"), QStringLiteral("r")},
                  {QStringLiteral("conv"), convName(c)}, {QStringLiteral("events"), events},
                  {QStringLiteral("next_after"), more ? last : s.head()}, {QStringLiteral("has_more"), more},
                  {QStringLiteral("head"), s.head()}, {QStringLiteral("min_seq"), s.min()},
                  {QStringLiteral("trimmed"), after < s.min() - 1}, {QStringLiteral("epoch"), s.epoch}});
}

QByteArray Harness::window(int c, qint64 before, std::optional<qint64> epoch, int limit) {
    // Contract section 6, "history" (Store::history).
    ServerConv &s = server_[c];
    if (epoch && *epoch != s.epoch)
        return errorFrame("EPOCH_CHANGED");
    if (before > s.head() + 1)
        return errorFrame("CURSOR_AHEAD");
    const qint64 below = before == 0 ? s.head() + 1 : before;
    QList<QJsonObject> picked;
    bool older = false;
    for (qint64 seq = below - 1; seq >= s.min(); --seq) {
        if (picked.size() == limit) {
            older = true;
            break;
        }
        picked.prepend(eventJson(s.cur().at(seq - 1)));
    }
    QJsonArray events;
    for (const QJsonObject &o : std::as_const(picked))
        events.append(o);
    const qint64 oldest = older ? picked.first().value(QStringLiteral("seq")).toInteger() : std::min(below, s.min());
    return frame({{QStringLiteral("t"), QStringLiteral("page")}, {QStringLiteral("rid"), QStringLiteral("r")},
                  {QStringLiteral("conv"), convName(c)}, {QStringLiteral("events"), events},
                  {QStringLiteral("oldest"), oldest}, {QStringLiteral("has_older"), older},
                  {QStringLiteral("head"), s.head()}, {QStringLiteral("min_seq"), s.min()},
                  {QStringLiteral("trimmed"), !older && s.min() > 1}, {QStringLiteral("epoch"), s.epoch}});
}

// ------------------------------------------------------------------ client side

void Harness::enqueue(int c, const QString &kind, qint64 target) {
    im::detail::OutboxRow row;
    row.cmid = QStringLiteral("cmid-%1").arg(++counter_);
    row.kind = kind;
    row.conv = convName(c);
    if (kind == u"send")
        row.body = QStringLiteral("draft %1").arg(counter_);
    row.target = target;
    row.createdAt = clock_;
    row.owner = QStringLiteral("user:me");
    if (store_->enqueue(row) == 0)
        violated(QStringLiteral("enqueue failed: %1").arg(store_->lastError()));
    index_.insert(row.cmid, entries_.size());
    entries_.append(Entry{row.cmid, row.conv, kind, target, MessageState::Pending, 0, 0, ++order_});
}

void Harness::attempt(int i, int mode) {
    // Outbox::transmit: markOnWire, then the server's answer (or none).
    QList<qsizetype> pending;
    for (qsizetype k = 0; k < entries_.size(); ++k)
        if (entries_[k].state == MessageState::Pending && !settling_.contains(entries_[k].cmid))
            pending.append(k);
    if (pending.isEmpty())
        return;
    Entry &e = entries_[pending.at(i % pending.size())];
    ++e.attempts;
    must(store_->markOnWire({{e.cmid, e.attempts}}), "markOnWire");
    if (mode == 2) {
        onOutcome(e.cmid, decoded(errorFrame("UNAVAILABLE")));
        return;
    }
    const QByteArray answer = serverAnswer(e);
    if (mode == 0)
        onOutcome(e.cmid, decoded(answer));
}

InFlight Harness::request(int c, InFlight::Kind kind, int limit, int gap) {
    const im::detail::ConvRow row = ensure(c);
    const std::optional<qint64> epoch = row.epoch > 0 ? std::optional<qint64>(row.epoch) : std::nullopt;
    InFlight f;
    f.kind = kind;
    f.epoch = row.epoch;
    if (kind == InFlight::Sync) {
        f.after = row.after;
        f.answer = page(c, row.after, epoch, limit);
    } else if (kind == InFlight::Newest) {
        f.gapLo = row.after + 1; // Sync::launch: the gap below the window starts above the cursor
        f.answer = window(c, 0, epoch, limit);
    } else {
        // MessageListModel: loadOlder(conv, gap.hi + 1, gap.lo).
        const std::optional<QList<im::detail::Gap>> gaps = store_->gaps(convName(c));
        must(gaps.has_value(), "gaps");
        if (gaps->isEmpty()) {
            f.answer.clear();
            return f;
        }
        const im::detail::Gap g = gaps->at(gap % gaps->size());
        f.before = g.hi + 1;
        f.gapLo = g.lo;
        f.answer = window(c, f.before, epoch, limit);
    }
    return f;
}

void Harness::resetConversation(int c, bool dropEvents) {
    must(store_->resetConversation(convName(c), dropEvents), "resetConversation");
    reset_[c] = true;
}

void Harness::onSyncFailed(int c, const Incoming &reply) {
    // Sync::onSyncFailed: only the cursor faults touch the store.
    const QString code = im::proto::errorCode(reply);
    if (code == im::proto::code::EpochChanged)
        resetConversation(c, true);
    else if (code == im::proto::code::CursorAhead)
        resetConversation(c, false);
}

void Harness::deliver(int c, const InFlight &f) {
    if (f.answer.isEmpty())
        return;
    const Incoming reply = decoded(f.answer);
    const im::proto::Disposition disp = im::proto::classify(reply);
    const Page *p = disp == im::proto::Disposition::Success ? std::get_if<Page>(&reply.body) : nullptr;
    const QString conv = convName(c);
    if (f.kind == InFlight::Sync) {
        // Sync::onPage.
        if (!p || p->history)
            return onSyncFailed(c, reply);
        const std::optional<im::detail::ConvRow> row = this->conv(c);
        if (row && row->epoch > 0 && p->epoch != row->epoch)
            return resetConversation(c, true);
        if (p->hasMore && p->nextAfter <= f.after)
            violated(QStringLiteral("the model server made a page with no progress"));
        const bool rebuild = !row || row->epoch == 0;
        must(store_->applyPage(*p), "applyPage");
        if (rebuild)
            requeueLost(c, p->head);
        ownEventsStored(p->events);
    } else if (f.kind == InFlight::Newest) {
        // Sync::onWindow.
        if (!p || !p->history)
            return onSyncFailed(c, reply);
        if (f.epoch > 0 && p->epoch != f.epoch)
            return resetConversation(c, true);
        const std::optional<im::detail::ConvRow> row = this->conv(c);
        const bool rebuild = !row || row->epoch == 0;
        must(store_->applyWindow(*p, 0, f.gapLo), "applyWindow(newest)");
        if (rebuild)
            requeueLost(c, p->head);
        ownEventsStored(p->events);
    } else {
        // Sync::onOlder (an error only restarts the forward sync).
        if (!p || !p->history || p->conv != conv)
            return;
        bool stale = false;
        must(store_->applyWindow(*p, f.before, f.gapLo, &stale), "applyWindow(older)");
        if (!stale)
            ownEventsStored(p->events);
    }
}

void Harness::push(int c, Input &in) {
    // Pushes as the gateway sends them (Sync::onEventPush / applyPushes):
    // one run of `event` frames applied in one transaction.
    ServerConv &s = server_[c];
    const int n = in.arg(3) + 1;
    const std::optional<im::detail::ConvRow> row = conv(c);
    const qint64 after = row ? row->after : 0;
    QList<Event> run;
    for (int i = 0; i < n; ++i) {
        const int how = in.arg(8);
        const int v = in.arg(256);
        const QList<Event> *log = &s.cur();
        qint64 seq = 0;
        if (how <= 3)
            seq = after + 1 + i;      // in order
        else if (how == 4)
            seq = s.head();           // the newest
        else if (how == 5)
            seq = v + 1;              // any
        else if (how == 6)
            seq = after;              // a repeat
        else if (s.log.count(s.epoch - 1)) {
            log = &s.log[s.epoch - 1]; // late, of the last epoch
            seq = v + 1;
        }
        if (seq < 1 || seq > log->size())
            continue;
        QJsonObject o{{QStringLiteral("t"), QStringLiteral("event")}, {QStringLiteral("ev"), eventJson(log->at(seq - 1))}};
        const Incoming push = decoded(frame(o));
        const auto *ev = std::get_if<im::proto::EventPush>(&push.body);
        if (!ev)
            violated(QStringLiteral("an event push decoded as another frame"));
        run.append(ev->ev);
        trace_.last() += QStringLiteral(" [%1@%2]").arg(seq).arg(log->at(seq - 1).epoch);
    }
    if (run.isEmpty())
        return;
    QList<bool> applied;
    must(store_->applyPushedEvents(run, &applied), "applyPushedEvents");
    QList<Event> done;
    for (qsizetype i = 0; i < run.size(); ++i)
        if (applied.value(i))
            done.append(run.at(i));
    ownEventsStored(done);
}

void Harness::ownEventsStored(const QList<Event> &events) {
    // Outbox::settleOwnEvents: our committed event is the answer.
    for (const Event &e : events) {
        if (e.cmid.isEmpty() || e.sender != Self || !index_.contains(e.cmid))
            continue;
        // Only the events that settle their draft now are checked at the
        // flush (an answer already batched wins, as in onOutcome).
        const Entry &en = entries_[index_.value(e.cmid)];
        if (en.state == MessageState::Pending && !settling_.contains(e.cmid))
            ownStored_.append(e);
        Incoming settled;
        if (e.kind == u"recall")
            settled.body = im::proto::Recalled{e.conv, e.seq, false};
        else
            settled.body = im::proto::Sent{e.conv, e.seq, e.mid, false, e.epoch};
        onOutcome(e.cmid, settled);
    }
}

void Harness::requeueLost(int c, qint64 head) {
    // Storage::startRebuild (the first page or newest window with no cursor):
    // our Sent messages above the server's head were lost by a restore and
    // go back to the end of the outbox, in creation order, as on the wire
    // once (docs/sdk.md, rule 7); not one we recalled (a recall of ours not
    // Failed names its seq).
    const QString name = convName(c);
    QStringList expected;
    for (Entry &e : entries_) {
        if (e.conv != name || e.kind != u"send" || e.state != MessageState::Sent || e.seq <= head)
            continue;
        bool recalled = false;
        for (const Entry &r : std::as_const(entries_))
            recalled = recalled || (r.conv == name && r.kind == u"recall" && r.target == e.seq && r.state != MessageState::Failed);
        if (recalled)
            continue;
        e.state = MessageState::Pending;
        e.seq = 0;
        e.attempts = 1;
        e.order = ++order_;
        expected.append(e.cmid);
    }
    // What the store handed over (Sync::handOverRequeued) is what the model put back.
    QStringList got;
    for (const im::detail::OutboxRow &r : store_->takeRequeued())
        got.append(r.cmid);
    if (got != expected)
        violated(QStringLiteral("%1: the rebuild at head %2 requeued [%3], expected [%4]")
                     .arg(name)
                     .arg(head)
                     .arg(got.join(u','), expected.join(u',')));
}

void Harness::onOutcome(const QString &cmid, const Incoming &reply) {
    // Outbox::onOutcome: an entry no longer in the outbox, or already
    // answered, ignores the answer; a retry or a verdict is batched.
    Entry &e = entries_[index_.value(cmid)];
    if (e.state != MessageState::Pending || settling_.contains(cmid))
        return;
    const im::proto::Disposition disp = im::proto::classify(reply);
    const QString code = im::proto::errorCode(reply);
    if (disp == im::proto::Disposition::Retry || disp == im::proto::Disposition::EndSession) {
        retries_.append({cmid, e.attempts, code, 0});
        return;
    }
    Storage::Finish f;
    f.cmid = cmid;
    f.state = int(MessageState::Sent);
    if (disp == im::proto::Disposition::Success) {
        if (const auto *s = std::get_if<im::proto::Sent>(&reply.body)) {
            f.seq = s->seq;
            f.dup = s->dup;
            f.epoch = s->epoch;
        } else if (const auto *r = std::get_if<im::proto::Recalled>(&reply.body)) {
            f.seq = r->seq;
            f.dup = r->dup;
        } else {
            violated(QStringLiteral("a success answer of the wrong type"));
        }
    } else {
        f.state = int(code == im::proto::code::OriginalExpired ? MessageState::Expired : MessageState::Failed);
        f.errorCode = code;
    }
    settling_.insert(cmid);
    finished_.append(f);
}

void Harness::flush() {
    // Outbox::flush: the batched answers in one transaction.
    const QList<Storage::Finish> finished = std::exchange(finished_, {});
    const QList<Storage::Retry> retries = std::exchange(retries_, {});
    settling_.clear();
    if (finished.isEmpty() && retries.isEmpty())
        return;
    must(store_->settleOutbox(finished, retries), "settleOutbox");
    for (const Storage::Finish &f : finished) {
        Entry &e = entries_[index_.value(f.cmid)];
        if (e.state != MessageState::Pending)
            violated(QStringLiteral("%1 answered again after it was final").arg(f.cmid));
        e.state = MessageState(f.state);
        e.seq = f.seq;
    }
    // Every own event stored since the last flush settled its draft with its seq.
    for (const Event &ev : std::exchange(ownStored_, {})) {
        const std::optional<im::detail::LocalMessage> m = store_->localMessage(ev.cmid);
        if (!m || m->state != int(MessageState::Sent) || m->seq != ev.seq)
            violated(QStringLiteral("own event %1 #%2 stored, its draft not settled with that seq (state %3, seq %4)")
                         .arg(ev.cmid)
                         .arg(ev.seq)
                         .arg(m ? m->state : -1)
                         .arg(m ? m->seq : -1));
    }
}

void Harness::restart() {
    // A crash and a new start: the store closes and opens on the same file;
    // what only the process held (answers in flight, batched settles) is gone.
    store_->close();
    open();
    for (auto &f : sync_)
        f.reset();
    for (auto &f : older_)
        f.reset();
    finished_.clear();
    retries_.clear();
    settling_.clear();
    ownStored_.clear();
}

// ------------------------------------------------------------------ checks

void Harness::check(bool outbox, int conv) {
    if (conv == AllConvs) {
        for (int c = 0; c < NConvs; ++c)
            checkConv(c);
    } else if (conv >= 0) {
        checkConv(conv);
    }
    if (!outbox)
        return;
    // The outbox: exactly the Pending drafts, in creation order (a requeued
    // one at the end, where the rebuild put it).
    const std::optional<QList<im::detail::OutboxRow>> rows = store_->loadOutbox();
    must(rows.has_value(), "loadOutbox");
    QList<const Entry *> byOrder;
    for (const Entry &e : std::as_const(entries_))
        byOrder.append(&e);
    std::sort(byOrder.begin(), byOrder.end(), [](const Entry *a, const Entry *b) { return a->order < b->order; });
    qsizetype r = 0;
    for (const Entry *ep : std::as_const(byOrder)) {
        const Entry &e = *ep;
        const std::optional<im::detail::LocalMessage> m = store_->localMessage(e.cmid);
        if (!m)
            violated(QStringLiteral("draft %1 lost (no local message)").arg(e.cmid));
        if (m->state != int(e.state) || (e.state == MessageState::Sent && m->seq != e.seq))
            violated(QStringLiteral("draft %1: local state %2 seq %3, expected %4 seq %5")
                         .arg(e.cmid)
                         .arg(m->state)
                         .arg(m->seq)
                         .arg(int(e.state))
                         .arg(e.seq));
        if (e.state != MessageState::Pending)
            continue;
        if (r >= rows->size() || rows->at(r).cmid != e.cmid)
            violated(QStringLiteral("pending draft %1 not in the outbox where expected").arg(e.cmid));
        if (rows->at(r).attempts != e.attempts)
            violated(QStringLiteral("draft %1: %2 attempts recorded, %3 made")
                         .arg(e.cmid)
                         .arg(rows->at(r).attempts)
                         .arg(e.attempts));
        ++r;
    }
    if (r != rows->size())
        violated(QStringLiteral("the outbox holds %1 rows, %2 drafts are pending").arg(rows->size()).arg(r));
}

void Harness::checkConv(int c) {
    const QString name = convName(c);
    const std::optional<im::detail::ConvRow> row = conv(c);
    Seen now;
    if (row)
        now = Seen{row->epoch, row->after};
    Seen &was = seen_[c];

    // The cursor moves as the epoch rule says.
    if (now.epoch == was.epoch && now.epoch > 0 && now.after < was.after)
        violated(QStringLiteral("%1: cursor went back from %2 to %3 in epoch %4")
                     .arg(name)
                     .arg(was.after)
                     .arg(now.after)
                     .arg(now.epoch));
    if (now.epoch != was.epoch && was.epoch != 0 && !(reset_[c] && now.epoch == 0))
        violated(QStringLiteral("%1: epoch went from %2 to %3 without a reset").arg(name).arg(was.epoch).arg(now.epoch));
    if (now.epoch == 0 && now.after != 0)
        violated(QStringLiteral("%1: cursor %2 without an epoch").arg(name).arg(now.after));
    was = now;

    const std::optional<QList<Event>> stored = store_->events(name);
    must(stored.has_value(), "events");
    QHash<qint64, Event> bySeq;
    ServerConv &s = server_[c];
    for (const Event &e : *stored) {
        if (bySeq.contains(e.seq))
            violated(QStringLiteral("%1: seq %2 stored twice").arg(name).arg(e.seq));
        bySeq.insert(e.seq, e);
        if (now.epoch > 0 && e.epoch != now.epoch)
            violated(QStringLiteral("%1: event %2 of epoch %3 stored under epoch %4").arg(name).arg(e.seq).arg(e.epoch).arg(now.epoch));
        const auto log = s.log.find(e.epoch);
        if (log == s.log.end() || e.seq > log->second.size() || log->second.at(e.seq - 1).mid != e.mid)
            violated(QStringLiteral("%1: stored event %2 (epoch %3, %4) is not the server's").arg(name).arg(e.seq).arg(e.epoch).arg(e.mid));
    }

    if (now.epoch > 0) {
        const QList<Event> &log = s.log[now.epoch];
        if (now.after > log.size())
            violated(QStringLiteral("%1: cursor %2 beyond the server's head %3").arg(name).arg(now.after).arg(log.size()));
        const std::optional<QList<im::detail::Gap>> gaps = store_->gaps(name);
        must(gaps.has_value(), "gaps");
        const qint64 purgedBelow = s.minSeq.count(now.epoch) ? s.minSeq[now.epoch] : 1;
        for (qint64 seq = 1; seq <= now.after; ++seq) {
            if (bySeq.contains(seq) || seq <= row->gapTo || seq < purgedBelow)
                continue;
            bool inGap = false;
            for (const im::detail::Gap &g : *gaps)
                inGap = inGap || (g.lo <= seq && seq <= g.hi);
            if (!inGap)
                violated(QStringLiteral("%1: cursor %2 passed event %3, not stored and in no gap").arg(name).arg(now.after).arg(seq));
        }
    }

    // The timeline: no message twice; drafts with no seq shown once; recalls.
    const std::optional<QList<im::detail::MessageRow>> timeline = store_->messages(name, Self);
    must(timeline.has_value(), "messages");
    QHash<QString, int> keys;
    for (const im::detail::MessageRow &m : *timeline)
        if (++keys[m.key()] > 1)
            violated(QStringLiteral("%1: %2 shown twice").arg(name, m.key()));
    for (const Entry &e : std::as_const(entries_))
        if (e.conv == name && e.kind == u"send" && e.state != MessageState::Sent && !keys.contains(e.cmid))
            violated(QStringLiteral("%1: draft %2 (state %3) not shown").arg(name, e.cmid).arg(int(e.state)));
    for (const Event &e : *stored) {
        if (e.kind != u"recall" || !bySeq.contains(e.target) || bySeq[e.target].kind != u"msg")
            continue;
        bool recalled = false;
        for (const im::detail::MessageRow &m : *timeline)
            recalled = recalled || (m.seq == e.target && m.state == int(MessageState::Recalled));
        if (!recalled)
            violated(QStringLiteral("%1: message %2 recalled by %3 does not read as recalled").arg(name).arg(e.target).arg(e.seq));
    }
}

// ------------------------------------------------------------------ the run

void Harness::run(Input &in) {
    open();
    static const char ops[] = "eroxapqhwgdufkEt";
    constexpr int nOps = sizeof(ops) - 1;
    for (int step = 0; step < MaxOps; ++step) {
        int b = in.op();
        if (b < 0)
            break;
        const char *known = std::strchr(ops, b);
        const char op = (known && b != 0) ? char(b) : ops[b % nOps];
        clock_ += 10;
        reset_.fill(false);
        trace_.append(QString(QLatin1Char(op)));
        auto argc = [&](int range) {
            const int v = in.arg(range);
            trace_.last() += QStringLiteral(" %1").arg(v);
            return v;
        };
        int touched = -1; // the conversation the operation names
        auto convArg = [&] { return touched = argc(NConvs); };
        switch (op) {
        case 'e': enqueue(convArg(), QStringLiteral("send"), 0); break;
        case 'r': {
            const int c = convArg();
            const qint64 head = server_[c].head();
            enqueue(c, QStringLiteral("recall"), head > 0 ? argc(int(head)) + 1 : 1);
            break;
        }
        case 'o': otherSends(convArg()); break;
        case 'x': { const int c = convArg(); otherRecalls(c, argc(16)); break; }
        case 'a': { const int i = argc(16); attempt(i, argc(3)); break; }
        case 'p':
        case 'h':
        case 'q':
        case 'w': {
            const int c = convArg();
            const int limit = argc(4) + 1;
            if (sync_[c]) // one sync of a conversation at a time (Sync's `running`)
                break;
            const InFlight f = request(c, op == 'p' || op == 'q' ? InFlight::Sync : InFlight::Newest, limit, 0);
            if (op == 'p' || op == 'h')
                deliver(c, f);
            else
                sync_[c] = f;
            break;
        }
        case 'g': {
            const int c = convArg();
            const int gap = argc(4);
            const int limit = argc(4) + 1;
            if (!older_[c]) // one older window at a time (Sync's `older_`)
                older_[c] = request(c, InFlight::Older, limit, gap);
            break;
        }
        case 'd': {
            const int c = convArg();
            auto &slot = argc(2) ? older_[c] : sync_[c];
            if (slot)
                deliver(c, *std::exchange(slot, std::nullopt));
            break;
        }
        case 'u': push(convArg(), in); break;
        case 'f': flush(); break;
        case 'k': restart(); break;
        case 'E': { const int c = convArg(); restore(c, argc(16)); break; }
        case 't': { const int c = convArg(); purge(c, argc(4) + 1); break; }
        }
        // What the operation can have changed is checked (the server's own
        // operations change nothing in the store; they are checked by the
        // next operation that brings their effect in).
        switch (op) {
        case 'o': case 'x': case 'E': case 't': break;
        case 'a': check(true, -1); break;
        case 'e': case 'r': check(true, touched); break;
        case 'f': case 'k': check(true, AllConvs); break;
        default: check(false, touched); break;
        }
    }
    store_->close();
}

QString storePath, templatePath;

} // namespace

extern "C" int LLVMFuzzerInitialize(int *argc, char ***argv) {
    // QSqlDatabase loads its driver plugin through the application object.
    static QCoreApplication app(*argc, *argv);
    const QString base = QDir(QStringLiteral("/dev/shm")).exists() ? QStringLiteral("/dev/shm") : QDir::tempPath();
    static QTemporaryDir dir(base + QStringLiteral("/fuzz_sdk_apply-XXXXXX"));
    if (!dir.isValid()) {
        std::fprintf(stderr, "fuzz_sdk_apply: cannot create a temporary folder in %s\n", qPrintable(base));
        std::abort();
    }
    storePath = dir.filePath(QStringLiteral("store.db"));
    // Every input starts from a copy of one freshly migrated store (the
    // migrations are the slowest part of a short input; open() still checks
    // the schema version of the copy).
    templatePath = dir.filePath(QStringLiteral("template.db"));
    Storage fresh;
    if (!fresh.open(templatePath) || !fresh.setMeta(QStringLiteral("user"), Self)) {
        std::fprintf(stderr, "fuzz_sdk_apply: cannot create %s: %s\n", qPrintable(templatePath),
                     qPrintable(fresh.lastError()));
        std::abort();
    }
    fresh.close();
    return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t *data, std::size_t size) {
    for (const char *suffix : {"", "-wal", "-shm", ".lock"})
        QFile::remove(storePath + QLatin1String(suffix));
    if (!QFile::copy(templatePath, storePath)) {
        std::fprintf(stderr, "fuzz_sdk_apply: cannot copy %s\n", qPrintable(templatePath));
        std::abort();
    }
    Input in(data, size);
    Harness(storePath).run(in);
    return 0;
}
