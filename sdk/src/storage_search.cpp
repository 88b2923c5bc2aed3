// Storage: the search index's upkeep (obligation 18). What is indexed: the
// current text (edit_body, else body) of every stored `msg` that is not
// recalled (its own flag, or a recall event stored for it), as
// searchtext::indexText() writes it, with its conversation's token. Every
// change goes through unindexEvent() (before the row changes: the
// contentless FTS5 table must be told the text it indexed) and
// indexEvent() (after), inside the transaction of the write that changes
// the row: the index and the events cannot disagree after a crash.
#include "storage_p.h"
#include "storagesql_p.h"

#include "searchreader_p.h"
#include "searchtext_p.h"

#include <QtCore/QCryptographicHash>
#include <QtCore/QElapsedTimer>
#include <QtCore/QUuid>
#include <QtCore/QVariant>
#include <QtSql/QSqlError>
#include <QtSql/QSqlQuery>

#include <limits>

namespace im::detail {

namespace {

// The token of a conversation in the index's `conv` column: one unicode61
// token whatever the id looks like (a query filters on it, then on the
// event's conv, so a collision costs nothing but time).
QString convToken(const QString &conv) {
    return QStringLiteral("c")
           + QString::fromLatin1(QCryptographicHash::hash(conv.toUtf8(), QCryptographicHash::Sha1).toHex().left(16));
}

// search_id = ts * 2^4 + a free low part: rowid order is newest first, and
// the index's doclists (rowid deltas as varints) stay small. Up to 16
// messages share a millisecond's ids; more take the next free id above
// (its order off by a millisecond at most per 16 of them).
constexpr int kLowBits = 4;
constexpr int kBuildSlice = 200; // events per read of the index build
constexpr int kMergePages = 64;   // pages written per step of the merge after it

// The text indexed for a msg row: its current body, then its attachments'
// names (dl50: obligation 18 finds files by name), a line each. A row
// without attachments indexes exactly its body, as before (no rebuild).
QString indexedText(const QString &alias = QString()) {
    return QStringLiteral("COALESCE(%1edit_body, %1body, '') || COALESCE(char(10) || %1att_names, '')").arg(alias);
}

} // namespace

SearchStatements::SearchStatements(const QSqlDatabase &db)
    : indexed(db), row(db), probe(db), ftsInsert(db), ftsDelete(db), setId(db), clearId(db), before(db),
      pageStored(db), pageRecalled(db), pageIds(db), termInsert(db) {
    termInsert.prepare(QStringLiteral("INSERT OR IGNORE INTO search_terms(term) VALUES(?)"));
    // insertEvent's one look before its upsert: the stored row (1, its
    // search_id, its text), or for a new one (0, whether the search id it
    // would take is taken, whether a recall of it is stored). UNION ALL
    // with LIMIT 1: the second part runs only when the first found nothing.
    before.prepare(QStringLiteral("SELECT 1, search_id, %1 FROM events WHERE conv = ? AND seq = ?"
                                  " UNION ALL SELECT 0, EXISTS(SELECT 1 FROM events WHERE search_id = ?),"
                                  " EXISTS(SELECT 1 FROM events WHERE conv = ? AND target = ? AND kind = 'recall')"
                                  " LIMIT 1").arg(indexedText()));
    pageStored.prepare(QStringLiteral("SELECT seq FROM events WHERE conv = ? AND seq BETWEEN ? AND ?"));
    pageRecalled.prepare(QStringLiteral("SELECT target FROM events WHERE conv = ? AND target BETWEEN ? AND ?"
                                        " AND kind = 'recall'"));
    pageIds.prepare(QStringLiteral("SELECT search_id FROM events WHERE search_id BETWEEN ? AND ? LIMIT ?"));
    indexed.prepare(QStringLiteral("SELECT search_id, %1 FROM events"
                                   " WHERE conv = ? AND seq = ? AND search_id IS NOT NULL").arg(indexedText()));
    row.prepare(QStringLiteral(
        "SELECT e.kind, %1, e.ts, e.recalled, e.search_id,"
        " EXISTS(SELECT 1 FROM events r WHERE r.conv = e.conv AND r.kind = 'recall' AND r.target = e.seq)"
        " FROM events e WHERE e.conv = ? AND e.seq = ?").arg(indexedText(QStringLiteral("e."))));
    probe.prepare(QStringLiteral("SELECT 1 FROM events WHERE search_id = ?"));
    ftsInsert.prepare(QStringLiteral("INSERT INTO search(rowid, body, conv) VALUES(?, ?, ?)"));
    ftsDelete.prepare(QStringLiteral("INSERT INTO search(search, rowid, body, conv) VALUES('delete', ?, ?, ?)"));
    setId.prepare(QStringLiteral("UPDATE events SET search_id = ? WHERE conv = ? AND seq = ?"));
    clearId.prepare(QStringLiteral("UPDATE events SET search_id = NULL WHERE conv = ? AND seq = ?"));
}

const QString &SearchStatements::token(const QString &conv) {
    auto it = convTokens.constFind(conv);
    if (it == convTokens.cend())
        it = convTokens.insert(conv, convToken(conv));
    return *it;
}

SearchStatements &Storage::searchStatements() {
    if (!search_)
        search_ = std::make_unique<SearchStatements>(QSqlDatabase::database(connection_, false));
    return *search_;
}

bool Storage::unindexEvent(const QString &conv, qint64 seq) {
    if (!searchUpkeep_)
        return true;
    SearchStatements &s = searchStatements();
    s.indexed.bindValue(0, conv);
    s.indexed.bindValue(1, seq);
    if (!exec(s.indexed))
        return false;
    if (!s.indexed.next()) {
        s.indexed.finish();
        return true;
    }
    const qint64 id = s.indexed.value(0).toLongLong();
    const QString text = s.indexed.value(1).toString();
    s.indexed.finish();
    s.ftsDelete.bindValue(0, id);
    s.ftsDelete.bindValue(1, searchtext::indexText(text));
    s.ftsDelete.bindValue(2, s.token(conv));
    s.clearId.bindValue(0, conv);
    s.clearId.bindValue(1, seq);
    return exec(s.ftsDelete) && exec(s.clearId);
}

bool Storage::indexEvent(const QString &conv, qint64 seq) {
    if (!searchUpkeep_)
        return true;
    SearchStatements &s = searchStatements();
    s.row.bindValue(0, conv);
    s.row.bindValue(1, seq);
    if (!exec(s.row))
        return false;
    if (!s.row.next()) {
        s.row.finish();
        return true;
    }
    const bool wanted = s.row.value(0).toString() == u"msg" && !s.row.value(3).toBool() && s.row.value(4).isNull()
                        && !s.row.value(5).toBool();
    const QString text = s.row.value(1).toString();
    const qint64 ts = std::max<qint64>(0, s.row.value(2).toLongLong());
    s.row.finish();
    if (!wanted || text.isEmpty())
        return true;
    const qint64 id = freeSearchId(ts, seq);
    if (id == 0)
        return false;
    s.ftsInsert.bindValue(0, id);
    s.ftsInsert.bindValue(1, searchtext::indexText(text));
    s.ftsInsert.bindValue(2, s.token(conv));
    s.setId.bindValue(0, id);
    s.setId.bindValue(1, conv);
    s.setId.bindValue(2, seq);
    if (looks_.valid)
        looks_.takenIds.insert(id); // the page's look must not offer it again
    return noteTerms(text) && exec(s.ftsInsert) && exec(s.setId);
}

bool Storage::noteTerms(const QString &text) {
    SearchStatements &s = searchStatements();
    for (const QString &t : searchtext::vocabTerms(text)) {
        if (knownTerms_.contains(t))
            continue;
        s.termInsert.bindValue(0, t);
        if (!exec(s.termInsert))
            return false;
        knownTerms_.insert(t);
    }
    return true;
}

qint64 Storage::freeSearchId(qint64 ts, qint64 seq) {
    // Newest first is rowid order: the commit time in the high bits, a
    // free low part (from the seq; the next free id above on a collision).
    SearchStatements &s = searchStatements();
    const qint64 first = (std::max<qint64>(0, ts) << kLowBits) + (seq & ((qint64(1) << kLowBits) - 1));
    for (qint64 id = first;; ++id) {
        s.probe.bindValue(0, id);
        if (!exec(s.probe))
            return 0;
        const bool taken = s.probe.next();
        s.probe.finish();
        if (!taken)
            return id;
        if (id - first > (qint64(1) << 20)) {
            fail(QStringLiteral("search index: no free id at ts %1").arg(ts));
            return 0;
        }
    }
}

namespace {
// A page's search ids read at once up to this many (a history window's
// time range shared with busy conversations); more: the per-event look.
constexpr int kLookIds = 2048;
qint64 firstSearchId(qint64 ts, qint64 seq) {
    return (std::max<qint64>(0, ts) << kLowBits) + (seq & ((qint64(1) << kLowBits) - 1));
}
} // namespace

bool Storage::lookAhead(const QString &conv, const QList<proto::Event> &events) {
    looks_ = PageLooks();
    if (!searchUpkeep_ || events.size() < 2)
        return true;
    PageLooks l;
    l.conv = conv;
    l.lo = l.idLo = std::numeric_limits<qint64>::max();
    l.hi = l.idHi = std::numeric_limits<qint64>::min();
    for (const proto::Event &e : events) {
        if (e.conv != conv)
            return true; // not one conversation's page: the per-event look
        l.lo = std::min(l.lo, e.seq);
        l.hi = std::max(l.hi, e.seq);
        const qint64 first = firstSearchId(e.ts, e.seq);
        l.idLo = std::min(l.idLo, first);
        l.idHi = std::max(l.idHi, first);
    }
    SearchStatements &s = searchStatements();
    s.pageStored.bindValue(0, conv);
    s.pageStored.bindValue(1, l.lo);
    s.pageStored.bindValue(2, l.hi);
    if (!exec(s.pageStored))
        return false;
    while (s.pageStored.next())
        l.stored.insert(s.pageStored.value(0).toLongLong());
    s.pageStored.finish();
    s.pageRecalled.bindValue(0, conv);
    s.pageRecalled.bindValue(1, l.lo);
    s.pageRecalled.bindValue(2, l.hi);
    if (!exec(s.pageRecalled))
        return false;
    while (s.pageRecalled.next())
        l.recalled.insert(s.pageRecalled.value(0).toLongLong());
    s.pageRecalled.finish();
    s.pageIds.bindValue(0, l.idLo);
    s.pageIds.bindValue(1, l.idHi);
    s.pageIds.bindValue(2, kLookIds + 1);
    if (!exec(s.pageIds))
        return false;
    while (s.pageIds.next())
        l.takenIds.insert(s.pageIds.value(0).toLongLong());
    s.pageIds.finish();
    if (l.takenIds.size() > kLookIds)
        return true; // too many to hold: the per-event look
    l.valid = true;
    looks_ = std::move(l);
    return true;
}

bool Storage::indexBeforeInsert(const proto::Event &e, bool *isNew, qint64 *newId) {
    *isNew = false;
    *newId = 0;
    if (!searchUpkeep_)
        return true;
    SearchStatements &s = searchStatements();
    const qint64 first = firstSearchId(e.ts, e.seq);
    bool taken = false, recalled = false;
    if (looks_.valid && e.kind == u"recall" && e.conv == looks_.conv)
        looks_.recalled.insert(e.target); // a page out of order: its target, later, stays out
    if (looks_.valid && e.conv == looks_.conv && e.seq >= looks_.lo && e.seq <= looks_.hi
        && first >= looks_.idLo && first <= looks_.idHi && !looks_.stored.contains(e.seq)) {
        // A new row, by the page's look (lookAhead()): a second copy of
        // this seq in the page finds it stored.
        looks_.stored.insert(e.seq);
        taken = looks_.takenIds.contains(first);
        recalled = looks_.recalled.contains(e.seq);
    } else {
        s.before.bindValue(0, e.conv);
        s.before.bindValue(1, e.seq);
        s.before.bindValue(2, first);
        s.before.bindValue(3, e.conv);
        s.before.bindValue(4, e.seq);
        if (!exec(s.before) || !s.before.next())
            return false;
        if (s.before.value(0).toInt() == 1) {
            // Stored already: out of the index now, back in after the upsert.
            const bool indexed = !s.before.value(1).isNull();
            const qint64 id = s.before.value(1).toLongLong();
            const QString text = s.before.value(2).toString();
            s.before.finish();
            if (!indexed)
                return true;
            s.ftsDelete.bindValue(0, id);
            s.ftsDelete.bindValue(1, searchtext::indexText(text));
            s.ftsDelete.bindValue(2, s.token(e.conv));
            s.clearId.bindValue(0, e.conv);
            s.clearId.bindValue(1, e.seq);
            return exec(s.ftsDelete) && exec(s.clearId);
        }
        taken = s.before.value(1).toBool();
        recalled = s.before.value(2).toBool();
        s.before.finish();
    }
    *isNew = true;
    // A new row: what the upsert will store is this copy's text.
    QString text = e.editSeq > 0 ? e.editBody : e.body;
    for (const proto::Attachment &a : e.attachments)
        text += u'\n' + a.name; // as indexedText() reads it back
    if (e.kind != u"msg" || e.recalled || text.isEmpty())
        return true;
    if (recalled)
        return true; // its recall is stored already (an older window)
    const qint64 id = taken ? freeSearchId(e.ts, e.seq) : first;
    if (id == 0)
        return false;
    s.ftsInsert.bindValue(0, id);
    s.ftsInsert.bindValue(1, searchtext::indexText(text));
    s.ftsInsert.bindValue(2, s.token(e.conv));
    if (!noteTerms(text) || !exec(s.ftsInsert))
        return false;
    if (looks_.valid)
        looks_.takenIds.insert(id);
    *newId = id;
    return true;
}

bool Storage::unindexRange(const QString &conv, qint64 above) {
    QSqlQuery q(QSqlDatabase::database(connection_, false));
    q.prepare(QStringLiteral("SELECT seq FROM events WHERE conv = ? AND seq > ? AND search_id IS NOT NULL"));
    q.addBindValue(conv);
    q.addBindValue(above);
    if (!exec(q))
        return false;
    QList<qint64> seqs;
    while (q.next())
        seqs.append(q.value(0).toLongLong());
    q.finish();
    for (const qint64 seq : std::as_const(seqs))
        if (!unindexEvent(conv, seq))
            return false;
    return true;
}

bool Storage::checkSearchVersion() {
    const std::optional<QString> v = meta(QStringLiteral("search_text_version"));
    if (!v)
        return false;
    if (*v == QString::number(searchtext::Version))
        return true;
    // Indexed by another version of indexText(): its rows cannot be deleted
    // one by one any more. Start over (the build runs in batches).
    if (!begin(Durability::Relaxed))
        return false;
    for (const QString &sql : {QStringLiteral("INSERT INTO search(search) VALUES('delete-all')"),
                               QStringLiteral("UPDATE events SET search_id = NULL WHERE search_id IS NOT NULL"),
                               QStringLiteral("DELETE FROM meta WHERE key IN ('search_build_done', 'search_build_total')")}) {
        if (!execSql(sql)) {
            const QString e = error_;
            rollback();
            return fail(e);
        }
    }
    if (!setMeta(QStringLiteral("search_build"), QString())
        || !setMeta(QStringLiteral("search_text_version"), QString::number(searchtext::Version))) {
        const QString e = error_;
        rollback();
        return fail(e);
    }
    return commit();
}

std::optional<bool> Storage::searchIndexComplete() {
    const std::optional<QString> state = meta(QStringLiteral("search_build"));
    if (!state)
        return std::nullopt;
    return *state == u"done" || *state == u"merge";
}

std::optional<bool> Storage::searchIndexSettled() {
    const std::optional<QString> state = meta(QStringLiteral("search_build"));
    if (!state)
        return std::nullopt;
    return *state == u"done";
}

std::optional<bool> Storage::mergeSearchSegments(int budgetMs) {
    // FTS5's incremental merge: a negative page count puts every segment
    // on one level and merges as few as two; done when a step changes
    // nothing (total_changes() moved by less than 2, FTS5's documentation).
    QElapsedTimer clock;
    clock.start();
    QSqlDatabase db = QSqlDatabase::database(connection_, false);
    QSqlQuery changes(db), merge(db);
    changes.prepare(QStringLiteral("SELECT total_changes()"));
    merge.prepare(QStringLiteral("INSERT INTO search(search, rank) VALUES('merge', -%1)").arg(kMergePages));
    do {
        if (!exec(changes) || !changes.next())
            return std::nullopt;
        const qint64 before = changes.value(0).toLongLong();
        changes.finish();
        if (!exec(merge))
            return std::nullopt;
        if (!exec(changes) || !changes.next())
            return std::nullopt;
        const qint64 after = changes.value(0).toLongLong();
        changes.finish();
        if (after - before < 2)
            return true;
    } while (clock.elapsed() < budgetMs);
    return false;
}

std::optional<Storage::IndexBuild> Storage::buildSearchIndex(int budgetMs) {
    QElapsedTimer clock;
    clock.start();
    const std::optional<QString> state = meta(QStringLiteral("search_build"));
    if (!state)
        return std::nullopt;
    IndexBuild out;
    const std::optional<QString> doneMeta = meta(QStringLiteral("search_build_done"));
    const std::optional<QString> totalMeta = meta(QStringLiteral("search_build_total"));
    if (!doneMeta || !totalMeta)
        return std::nullopt;
    out.done = doneMeta->toLongLong();
    out.total = totalMeta->toLongLong();
    if (*state == u"done") {
        out.finished = out.settled = true;
        return out;
    }
    if (!begin(Durability::Relaxed))
        return std::nullopt;
    if (*state == u"merge") {
        out.finished = true;
        const std::optional<bool> merged = mergeSearchSegments(budgetMs);
        if (!merged || (*merged && !setMeta(QStringLiteral("search_build"), QStringLiteral("done")))) {
            const QString e = error_;
            rollback();
            fail(e);
            return std::nullopt;
        }
        out.settled = *merged;
        if (!commit())
            return std::nullopt;
        return out;
    }
    auto abort = [this]() -> std::optional<IndexBuild> {
        const QString e = error_;
        rollback();
        fail(e);
        return std::nullopt;
    };
    QSqlDatabase db = QSqlDatabase::database(connection_, false);
    if (totalMeta->isEmpty()) {
        QSqlQuery c(db);
        c.prepare(QStringLiteral("SELECT COUNT(*) FROM events WHERE kind = 'msg' AND search_id IS NULL"));
        if (!exec(c) || !c.next()) { c = QSqlQuery(); return abort(); }
        out.total = c.value(0).toLongLong();
    }
    // Resumable: the key (conv, seq) below which everything is indexed.
    QString conv = QStringLiteral(""); // not NULL: it is compared
    qint64 seq = -1;
    if (!state->isEmpty()) {
        const qsizetype cut = state->lastIndexOf(u'\n');
        conv = state->left(cut);
        seq = state->mid(cut + 1).toLongLong();
    }
    bool finished = false;
    {
        QSqlQuery q(db);
        q.prepare(QStringLiteral("SELECT conv, seq FROM events WHERE (conv, seq) > (?, ?) AND kind = 'msg'"
                                 " AND search_id IS NULL ORDER BY conv, seq LIMIT ?"));
        do {
            q.bindValue(0, conv);
            q.bindValue(1, seq);
            q.bindValue(2, kBuildSlice);
            if (!exec(q)) { q = QSqlQuery(); return abort(); }
            QList<QPair<QString, qint64>> batch;
            while (q.next())
                batch.append({q.value(0).toString(), q.value(1).toLongLong()});
            q.finish();
            for (const auto &[c, s] : std::as_const(batch)) {
                if (!indexEvent(c, s)) { q = QSqlQuery(); return abort(); }
                ++out.done;
            }
            if (batch.size() < kBuildSlice) {
                finished = true;
                break;
            }
            conv = batch.last().first;
            seq = batch.last().second;
        } while (clock.elapsed() < budgetMs);
    }
    out.finished = finished;
    if (!setMeta(QStringLiteral("search_build"), finished ? QStringLiteral("merge") : conv + u'\n' + QString::number(seq))
        || !setMeta(QStringLiteral("search_build_done"), QString::number(out.done))
        || !setMeta(QStringLiteral("search_build_total"), QString::number(out.total)))
        return abort();
    if (!commit())
        return std::nullopt;
    return out;
}

qint64 Storage::searchIdOf(const QString &conv, qint64 seq) {
    QSqlQuery q(QSqlDatabase::database(connection_, false));
    q.prepare(QStringLiteral("SELECT COALESCE(search_id, 0) FROM events WHERE conv = ? AND seq = ?"));
    q.addBindValue(conv);
    q.addBindValue(seq);
    if (!exec(q) || !q.next())
        return 0;
    return q.value(0).toLongLong();
}

// --- SearchReader -----------------------------------------------------

SearchReader::SearchReader(const QString &path)
    : path_(path), connection_(QStringLiteral("imsdk-search-") + QUuid::createUuid().toString(QUuid::WithoutBraces)) {}

SearchReader::~SearchReader() {
    if (QSqlDatabase::contains(connection_)) {
        QSqlDatabase::database(connection_, false).close();
        QSqlDatabase::removeDatabase(connection_);
    }
}

bool SearchReader::open() {
    if (open_)
        return true;
    QSqlDatabase db = QSqlDatabase::addDatabase(QStringLiteral("QSQLITE"), connection_);
    db.setDatabaseName(path_);
    // Read-only: it never takes the write lock the client's connection needs.
    db.setConnectOptions(QStringLiteral("QSQLITE_OPEN_READONLY;QSQLITE_BUSY_TIMEOUT=%1").arg(Storage::BusyTimeoutMs));
    if (!db.open()) {
        error_ = db.lastError().text();
        return false;
    }
    open_ = true;
    return true;
}

std::optional<QList<SearchHit>> SearchReader::search(const QString &fts, const QString &conv, qint64 before,
                                                     int limit) {
    if (!open())
        return std::nullopt;
    QSqlQuery q(QSqlDatabase::database(connection_, false));
    // The FTS5 table drives (rowid order, newest first, stops at the
    // limit); each hit's event by events_search. A conversation is a
    // token of the index's conv column (then checked on the event).
    const QString match = conv.isEmpty()
                              ? QStringLiteral("body : (%1)").arg(fts)
                              : QStringLiteral("body : (%1) AND conv : %2").arg(fts, convToken(conv));
    q.prepare(QStringLiteral(
        "SELECT s.rowid, e.conv, e.seq, e.sender, e.ts, COALESCE(e.edit_body, e.body)"
        " FROM search s CROSS JOIN events e"
        " WHERE search MATCH :match AND s.rowid < :before AND e.search_id = s.rowid%1"
        " ORDER BY s.rowid DESC LIMIT :limit")
                  .arg(conv.isEmpty() ? QString() : QStringLiteral(" AND e.conv = :conv")));
    q.bindValue(QStringLiteral(":match"), match);
    q.bindValue(QStringLiteral(":before"), before > 0 ? before : std::numeric_limits<qint64>::max());
    q.bindValue(QStringLiteral(":limit"), limit);
    if (!conv.isEmpty())
        q.bindValue(QStringLiteral(":conv"), conv);
    if (!q.exec()) {
        error_ = QStringLiteral("SQLite: %1").arg(q.lastError().text());
        return std::nullopt;
    }
    QList<SearchHit> out;
    while (q.next())
        out.append({q.value(0).toLongLong(), q.value(1).toString(), q.value(2).toLongLong(), q.value(3).toString(),
                    q.value(4).toLongLong(), q.value(5).toString()});
    return out;
}

std::optional<QStringList> SearchReader::vocabulary(const QString &prefix, int cap) {
    if (!open())
        return std::nullopt;
    QSqlQuery q(QSqlDatabase::database(connection_, false));
    q.prepare(QStringLiteral("SELECT term FROM search_terms WHERE term >= ? AND term < ? ORDER BY term LIMIT ?"));
    q.addBindValue(prefix);
    q.addBindValue(prefix + QChar(0x7f)); // entries are ASCII (and the mark, 0x01)
    q.addBindValue(cap + 1);
    if (!q.exec())
        return std::nullopt; // the query falls back to FTS5's prefix
    QStringList out;
    while (q.next())
        out << q.value(0).toString();
    if (out.size() > cap)
        return std::nullopt;
    return out;
}

std::optional<QList<ConvCoverage>> SearchReader::coverage(const QString &conv) {
    if (!open())
        return std::nullopt;
    QSqlQuery q(QSqlDatabase::database(connection_, false));
    q.prepare(QStringLiteral(
        "SELECT c.conv, COALESCE((SELECT SUM(g.hi - g.lo + 1) FROM gaps g WHERE g.conv = c.conv), 0),"
        " MAX(0, c.head - c.after), c.gap_to FROM conversations c"
        " WHERE (:conv = '' OR c.conv = :conv) ORDER BY c.conv"));
    q.bindValue(QStringLiteral(":conv"), conv.isNull() ? QStringLiteral("") : conv);
    if (!q.exec()) {
        error_ = QStringLiteral("SQLite: %1").arg(q.lastError().text());
        return std::nullopt;
    }
    QList<ConvCoverage> out;
    while (q.next()) {
        ConvCoverage c{q.value(0).toString(), q.value(1).toLongLong(), q.value(2).toLongLong(),
                       q.value(3).toLongLong()};
        if (c.loadable() || c.purged > 0)
            out.append(c);
    }
    return out;
}

std::optional<bool> SearchReader::indexComplete() {
    if (!open())
        return std::nullopt;
    QSqlQuery q(QSqlDatabase::database(connection_, false));
    if (!q.exec(QStringLiteral("SELECT value FROM meta WHERE key = 'search_build'"))) {
        error_ = QStringLiteral("SQLite: %1").arg(q.lastError().text());
        return std::nullopt;
    }
    // "merge": every row is in, the segments are being merged.
    return q.next() && (q.value(0).toString() == u"done" || q.value(0).toString() == u"merge");
}

} // namespace im::detail
