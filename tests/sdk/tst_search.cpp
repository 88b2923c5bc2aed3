// Obligation 18 (issue 51): on-device search. Real SQLite files: the
// client's store (detail::Storage) written by pages and windows as sync
// writes them, searched through the search thread's read-only connection
// (detail::SearchReader, runSearch) and through im::SearchModel on a Client.
// Edits re-indexed, recalls and resets removed, CJK by any substring of two
// characters, accents and case, prefixes, paging newest first, coverage,
// the index of an older store built in resumable batches, and a failed page
// that leaves neither its events nor their index.
#include "searchreader_p.h"
#include "searchservice_p.h"
#include "searchtext_p.h"
#include "storage_p.h"

#include <im/client.h>
#include <im/searchmodel.h>

#include <QtCore/QFile>
#include <QtCore/QRandomGenerator>
#include <QtCore/QTemporaryDir>
#include <QtSql/QSqlError>
#include <QtSql/QSqlQuery>
#include <QtTest/QtTest>

#ifndef IM_STORE_FIXTURES
#error "IM_STORE_FIXTURES must name tests/sdk/fixtures"
#endif

using im::detail::SearchReader;
using im::detail::Storage;
namespace proto = im::proto;
namespace st = im::detail::searchtext;

namespace {

constexpr qint64 kT0 = 1796000000000;

proto::Event msg(const QString &conv, qint64 seq, const QString &body, const QString &sender = QStringLiteral("ben")) {
    proto::Event e;
    e.conv = conv;
    e.seq = seq;
    e.mid = QStringLiteral("m-%1-%2").arg(conv).arg(seq);
    e.kind = QStringLiteral("msg");
    e.sender = sender;
    e.body = body;
    e.ts = kT0 + seq * 1000;
    e.epoch = 1;
    return e;
}

proto::Event change(const QString &kind, const QString &conv, qint64 seq, qint64 target, const QString &body = {}) {
    proto::Event e = msg(conv, seq, body);
    e.kind = kind;
    e.target = target;
    return e;
}

proto::Page page(const QString &conv, const QList<proto::Event> &events, qint64 epoch = 1) {
    proto::Page p;
    p.conv = conv;
    p.events = events;
    p.epoch = epoch;
    p.head = events.isEmpty() ? 0 : events.last().seq;
    p.nextAfter = p.head;
    return p;
}

// Writes a fixture's SQL text into a new SQLite file; empty on success.
QString loadFixture(int version, const QString &path) {
    QFile f(QStringLiteral(IM_STORE_FIXTURES "/store-v%1.sql").arg(version));
    if (!f.open(QIODevice::ReadOnly))
        return QStringLiteral("cannot read %1").arg(f.fileName());
    const QString sql = QString::fromUtf8(f.readAll());
    QString error;
    {
        QSqlDatabase db = QSqlDatabase::addDatabase(QStringLiteral("QSQLITE"), QStringLiteral("fixture"));
        db.setDatabaseName(path);
        if (!db.open())
            error = db.lastError().text();
        QSqlQuery q(db);
        for (const QString &line : sql.split(u'\n', Qt::SkipEmptyParts)) {
            if (!error.isEmpty())
                break;
            if (line.startsWith(u"--"))
                continue;
            if (!q.exec(line))
                error = QStringLiteral("%1: %2").arg(q.lastError().text(), line);
        }
        q = QSqlQuery();
        db.close();
    }
    QSqlDatabase::removeDatabase(QStringLiteral("fixture"));
    return error;
}

// Runs SQL on its own connection to `path` (fixtures, checks).
QString sqlExec(const QString &path, const QStringList &statements, QVariant *firstValue = nullptr) {
    QString error;
    {
        QSqlDatabase db = QSqlDatabase::addDatabase(QStringLiteral("QSQLITE"), QStringLiteral("raw"));
        db.setDatabaseName(path);
        if (!db.open())
            error = db.lastError().text();
        QSqlQuery q(db);
        for (const QString &s : statements) {
            if (!error.isEmpty())
                break;
            if (!q.exec(s))
                error = QStringLiteral("%1: %2").arg(q.lastError().text(), s);
            else if (firstValue && q.next())
                *firstValue = q.value(0);
        }
        q = QSqlQuery();
        db.close();
    }
    QSqlDatabase::removeDatabase(QStringLiteral("raw"));
    return error;
}

QVariant sqlValue(const QString &path, const QString &select) {
    QVariant v;
    const QString error = sqlExec(path, {select}, &v);
    if (!error.isEmpty())
        qWarning("%s", qPrintable(error));
    return v;
}


// The index text and vocabulary as schema 7 first wrote them (runs of
// CJK and other text, then words): the one-pass versions in searchtext.cpp
// must write exactly this (a contentless index deletes a row by the very
// text it indexed, and searchtext::Version stayed 1).
namespace reference {

struct Run {
    QString text;
    bool cjk = false;
};

QList<Run> runs(const QString &s) {
    QList<Run> out;
    for (qsizetype i = 0; i < s.size();) {
        const bool pair = s.at(i).isHighSurrogate() && i + 1 < s.size() && s.at(i + 1).isLowSurrogate();
        const char32_t c = pair ? QChar::surrogateToUcs4(s.at(i), s.at(i + 1)) : char32_t(s.at(i).unicode());
        const bool cjk = st::isCjk(c);
        if (out.isEmpty() || out.last().cjk != cjk)
            out.append({QString(), cjk});
        out.last().text += s.mid(i, pair ? 2 : 1);
        i += pair ? 2 : 1;
    }
    return out;
}

QStringList codePoints(const QString &s) {
    QStringList out;
    for (qsizetype i = 0; i < s.size();) {
        const bool pair = s.at(i).isHighSurrogate() && i + 1 < s.size() && s.at(i + 1).isLowSurrogate();
        out << s.mid(i, pair ? 2 : 1);
        i += pair ? 2 : 1;
    }
    return out;
}

QString nfkc(const QString &s) {
    return std::all_of(s.begin(), s.end(), [](QChar c) { return c.unicode() < 0x80; })
               ? s
               : s.normalized(QString::NormalizationForm_KC);
}

QString indexText(const QString &body) {
    QString out;
    for (const Run &r : runs(nfkc(body))) {
        if (!r.cjk) {
            out += r.text;
            continue;
        }
        const QStringList cps = codePoints(r.text);
        out += u' ';
        for (qsizetype i = 0; i + 1 < cps.size(); ++i)
            out += cps[i] + cps[i + 1] + u' ';
        out += cps.last() + u' ';
    }
    return out;
}

bool isWordChar(char32_t c) {
    if (c < 0x80)
        return (c >= u'a' && c <= u'z') || (c >= u'A' && c <= u'Z') || (c >= u'0' && c <= u'9');
    return QChar::isLetterOrNumber(c) || QChar::category(c) == QChar::Other_PrivateUse;
}

QStringList vocabTerms(const QString &body) {
    QStringList out;
    for (const Run &r : runs(nfkc(body))) {
        if (r.cjk)
            continue;
        QStringList words;
        QString word;
        for (const QString &cp : codePoints(r.text)) {
            const char32_t c = cp.size() == 2 ? QChar::surrogateToUcs4(cp.at(0), cp.at(1)) : char32_t(cp.at(0).unicode());
            if (isWordChar(c)) {
                word += cp;
            } else if (!word.isEmpty()) {
                words << word;
                word.clear();
            }
        }
        if (!word.isEmpty())
            words << word;
        for (const QString &w : std::as_const(words)) {
            QString f;
            for (const QString &cp : codePoints(w))
                for (const QChar ch : cp.normalized(QString::NormalizationForm_KD))
                    if (ch.category() != QChar::Mark_NonSpacing)
                        f += ch;
            f = f.toLower();
            const bool ascii = std::all_of(f.begin(), f.end(), [](QChar c) { return c.unicode() < 0x80; });
            QString entry = f;
            if (!ascii) {
                qsizetype lead = 0;
                while (lead < f.size() && f.at(lead).unicode() < 0x80)
                    ++lead;
                if (lead == 0)
                    continue;
                entry = f.left(lead) + st::VocabPrefixMark;
            }
            if (!out.contains(entry))
                out << entry;
        }
    }
    return out;
}

} // namespace reference

} // namespace

class TestSearch : public QObject {
    Q_OBJECT
private:
    QTemporaryDir dir_;
    QString path_;
    std::unique_ptr<Storage> store_;
    std::unique_ptr<SearchReader> reader_;
    int n_ = 0;

    // The (conv, seq) of each result of `query`, newest first.
    QStringList find(const QString &query, const QString &conv = {}, int limit = 100, qint64 before = 0) {
        QString error;
        const auto found = im::detail::runSearch(*reader_, query, conv, limit, before, &error);
        if (!found) {
            qWarning("search failed: %s", qPrintable(error));
            return {QStringLiteral("ERROR")};
        }
        QStringList out;
        for (const im::SearchResult &r : *found)
            out << QStringLiteral("%1:%2").arg(r.conv()).arg(r.seq());
        return out;
    }
    // The FTS5 index is sound (a delete told the wrong text breaks it) and
    // holds exactly the indexed events: as many documents (each has one
    // conv token, counted by fts5vocab) as events with a search_id.
    bool indexIntact() {
        QSqlQuery q(QSqlDatabase::database(QStringLiteral("check"), false));
        if (!q.exec(QStringLiteral("INSERT INTO search(search, rank) VALUES('integrity-check', 0)"))) {
            qWarning("integrity-check: %s", qPrintable(q.lastError().text()));
            return false;
        }
        if (!q.exec(QStringLiteral("CREATE VIRTUAL TABLE IF NOT EXISTS temp.vocab USING fts5vocab(main, search, 'col')"))
            || !q.exec(QStringLiteral("SELECT (SELECT COALESCE(SUM(doc), 0) FROM temp.vocab WHERE col = 'conv'),"
                                      " (SELECT COUNT(*) FROM events WHERE search_id IS NOT NULL)"))
            || !q.next()) {
            qWarning("vocab: %s", qPrintable(q.lastError().text()));
            return false;
        }
        if (q.value(0).toLongLong() != q.value(1).toLongLong()) {
            qWarning("index holds %lld documents, %lld events are indexed", q.value(0).toLongLong(),
                     q.value(1).toLongLong());
            return false;
        }
        return true;
    }

private slots:
    void init() {
        path_ = dir_.filePath(QStringLiteral("s%1.db").arg(++n_));
        store_ = std::make_unique<Storage>();
        QVERIFY2(store_->open(path_), qPrintable(store_->lastError()));
        QVERIFY(store_->setMeta(QStringLiteral("user"), QStringLiteral("ana")));
        reader_ = std::make_unique<SearchReader>(path_);
        QSqlDatabase db = QSqlDatabase::addDatabase(QStringLiteral("QSQLITE"), QStringLiteral("check"));
        db.setDatabaseName(path_);
        QVERIFY(db.open());
    }
    void cleanup() {
        if (QTest::currentTestFailed() == false)
            QVERIFY(indexIntact());
        QSqlDatabase::database(QStringLiteral("check"), false).close();
        QSqlDatabase::removeDatabase(QStringLiteral("check"));
        reader_.reset();
        store_.reset();
    }

    void a_new_store_is_indexed_from_the_start() {
        QCOMPARE(store_->schemaVersion(), Storage::SchemaVersion);
        QCOMPARE(store_->searchIndexComplete().value_or(false), true);
        QVERIFY(store_->applyPage(page(QStringLiteral("c1"), {msg(QStringLiteral("c1"), 1, QStringLiteral("hello world"))})));
        QVERIFY(store_->searchIdOf(QStringLiteral("c1"), 1) > 0);
        QCOMPARE(find(QStringLiteral("hello")), QStringList{QStringLiteral("c1:1")});
    }

    void an_edit_is_searched_by_its_new_text_only() {
        const QString c = QStringLiteral("c1");
        QVERIFY(store_->applyPage(page(c, {msg(c, 1, QStringLiteral("lunch at noon")), msg(c, 2, QStringLiteral("ok"))})));
        QCOMPARE(find(QStringLiteral("lunch")), QStringList{QStringLiteral("c1:1")});
        QVERIFY(store_->applyPage(page(c, {change(QStringLiteral("edit"), c, 3, 1, QStringLiteral("dinner at eight"))})));
        QCOMPARE(find(QStringLiteral("lunch")), QStringList());
        QCOMPARE(find(QStringLiteral("dinner")), QStringList{QStringLiteral("c1:1")});
        // A second edit replaces the first; re-applying an old copy of the
        // message (a re-sync) keeps the newest edit.
        QVERIFY(store_->applyPage(page(c, {change(QStringLiteral("edit"), c, 4, 1, QStringLiteral("breakfast"))})));
        QVERIFY(store_->applyPage(page(c, {msg(c, 1, QStringLiteral("lunch at noon"))})));
        QCOMPARE(find(QStringLiteral("dinner")), QStringList());
        QCOMPARE(find(QStringLiteral("lunch")), QStringList());
        QCOMPARE(find(QStringLiteral("breakfast")), QStringList{QStringLiteral("c1:1")});
        // The edit events themselves are not results.
        QCOMPARE(find(QStringLiteral("eight")), QStringList());
    }

    void a_recalled_message_is_never_found() {
        const QString c = QStringLiteral("c1");
        QVERIFY(store_->applyPage(page(c, {msg(c, 1, QStringLiteral("secret plan")), msg(c, 2, QStringLiteral("plan b"))})));
        QCOMPARE(find(QStringLiteral("plan")), (QStringList{QStringLiteral("c1:2"), QStringLiteral("c1:1")}));
        QVERIFY(store_->applyPage(page(c, {change(QStringLiteral("recall"), c, 3, 1)})));
        QCOMPARE(find(QStringLiteral("plan")), QStringList{QStringLiteral("c1:2")});
        QCOMPARE(store_->searchIdOf(c, 1), 0);
        // A message whose recall is stored before it (an older window
        // arriving after the newer events), or whose copy says recalled.
        const QString d = QStringLiteral("c2");
        QVERIFY(store_->applyPage(page(d, {change(QStringLiteral("recall"), d, 5, 4)})));
        proto::Page older = page(d, {msg(d, 4, QStringLiteral("secret two"))});
        QVERIFY(store_->applyWindow(older, 5, 1));
        proto::Event gone = msg(d, 6, QStringLiteral("secret three"));
        gone.recalled = true;
        QVERIFY(store_->applyPage(page(d, {gone})));
        QCOMPARE(find(QStringLiteral("secret")), QStringList());
    }

    // A user's erase (docs/protocol.md, "Erased events"): the operator's
    // recall marked erased drops the stored text (body and edit) and the
    // index entry; a page's copy marked erased does the same.
    void an_erased_message_loses_its_text_in_the_store_and_the_index() {
        const QString c = QStringLiteral("c1");
        QVERIFY(store_->applyPage(page(c, {msg(c, 1, QStringLiteral("secret plan")), msg(c, 2, QStringLiteral("plan b")),
                                           change(QStringLiteral("edit"), c, 3, 1, QStringLiteral("secret edited plan"))})));
        QCOMPARE(find(QStringLiteral("secret")), QStringList{QStringLiteral("c1:1")});
        proto::Event recall = change(QStringLiteral("recall"), c, 4, 1);
        recall.sender.clear(); // by the operator
        recall.erased = true;
        QVERIFY(store_->applyPage(page(c, {recall})));
        QCOMPARE(find(QStringLiteral("secret")), QStringList());
        QCOMPARE(find(QStringLiteral("plan")), QStringList{QStringLiteral("c1:2")});
        QSqlQuery q(QSqlDatabase::database(QStringLiteral("check"), false));
        QVERIFY(q.exec(QStringLiteral("SELECT body IS NULL, edit_body IS NULL, recalled FROM events"
                                      " WHERE conv = 'c1' AND seq = 1")));
        QVERIFY(q.next());
        QCOMPARE(q.value(0).toInt(), 1);
        QCOMPARE(q.value(1).toInt(), 1);
        QCOMPARE(q.value(2).toInt(), 1);
        // A page's copy of an erased msg (a re-sync, or a store that holds
        // it from before): no text stays, the edit it knew included.
        QVERIFY(store_->applyPage(page(c, {change(QStringLiteral("edit"), c, 5, 2, QStringLiteral("plan c"))})));
        proto::Event erased = msg(c, 2, QString());
        erased.recalled = true;
        erased.erased = true;
        QVERIFY(store_->applyPage(page(c, {erased})));
        QCOMPARE(find(QStringLiteral("plan")), QStringList());
        QVERIFY(q.exec(QStringLiteral("SELECT COUNT(*) FROM events WHERE conv = 'c1' AND kind = 'msg'"
                                      " AND (body IS NOT NULL OR edit_body IS NOT NULL)")));
        QVERIFY(q.next());
        QCOMPARE(q.value(0).toInt(), 0);
    }

    void an_epoch_reset_drops_the_conversation_from_the_index() {
        const QString a = QStringLiteral("a"), b = QStringLiteral("b");
        QVERIFY(store_->applyPage(page(a, {msg(a, 1, QStringLiteral("shared word")), msg(a, 2, QStringLiteral("word two"))})));
        QVERIFY(store_->applyPage(page(b, {msg(b, 1, QStringLiteral("word in b"))})));
        QCOMPARE(find(QStringLiteral("word")).size(), 3);
        QVERIFY(store_->resetConversation(a, true));
        QCOMPARE(find(QStringLiteral("word")), QStringList{QStringLiteral("b:1")});
        QVERIFY(indexIntact());
        // A rebuild after a restored server drops what lies above its head.
        QVERIFY(store_->applyPage(page(b, {msg(b, 2, QStringLiteral("word lost"))})));
        QVERIFY(store_->resetConversation(b, false));
        proto::Page again = page(b, {msg(b, 1, QStringLiteral("word in b"))});
        again.head = 1;
        QVERIFY(store_->applyPage(again));
        QCOMPARE(find(QStringLiteral("word")), QStringList{QStringLiteral("b:1")});
        QVERIFY(indexIntact());
        // An install reset drops it all.
        QVERIFY(store_->resetInstallState(QStringLiteral("new-install")));
        QCOMPARE(find(QStringLiteral("word")), QStringList());
    }

    void chinese_is_found_by_any_substring_of_two_characters_data() {
        QTest::addColumn<QString>("query");
        QTest::addColumn<bool>("found");
        QTest::addRow("two at the start") << QStringLiteral("我们") << true;
        QTest::addRow("two in the middle") << QStringLiteral("明天") << true;
        QTest::addRow("two at the end") << QStringLiteral("开会") << true;
        QTest::addRow("three") << QStringLiteral("下午三") << true;
        QTest::addRow("the whole run") << QStringLiteral("我们明天下午三点开会") << true;
        QTest::addRow("one character") << QStringLiteral("会") << true;
        QTest::addRow("one inside") << QStringLiteral("午") << true;
        QTest::addRow("not adjacent") << QStringLiteral("我明") << false;
        QTest::addRow("reversed") << QStringLiteral("天明") << false;
        QTest::addRow("across the Latin word") << QStringLiteral("会议") << false;
        QTest::addRow("with a Latin word") << QStringLiteral("明天 Zoom") << true;
        QTest::addRow("Japanese") << QStringLiteral("がな") << true;
        QTest::addRow("kana differ by their marks") << QStringLiteral("かな") << false;
        QTest::addRow("Korean") << QStringLiteral("회의") << true;
        QTest::addRow("absent") << QStringLiteral("北京") << false;
    }
    void chinese_is_found_by_any_substring_of_two_characters() {
        QFETCH(QString, query);
        QFETCH(bool, found);
        const QString c = QStringLiteral("c1");
        QVERIFY(store_->applyPage(page(c, {msg(c, 1, QStringLiteral("我们明天下午三点开会，用zoom议程见附件")),
                                           msg(c, 2, QStringLiteral("ひらがなとカタカナ")),
                                           msg(c, 3, QStringLiteral("내일 회의 있어요"))})));
        QCOMPARE(!find(query).isEmpty(), found);
    }

    void latin_words_match_by_prefix_without_case_or_accents_data() {
        QTest::addColumn<QString>("query");
        QTest::addColumn<QStringList>("expected");
        const QStringList one{QStringLiteral("c1:1")}, two{QStringLiteral("c1:2")}, none;
        QTest::addRow("word") << QStringLiteral("meeting") << one;
        QTest::addRow("prefix") << QStringLiteral("meet") << one;
        QTest::addRow("case") << QStringLiteral("MEETING") << one;
        QTest::addRow("not inside a word") << QStringLiteral("eeting") << none;
        QTest::addRow("accent in the text") << QStringLiteral("cafe") << two;
        QTest::addRow("accent in the query") << QStringLiteral("crème") << two;
        QTest::addRow("accent both") << QStringLiteral("Café") << two;
        QTest::addRow("German") << QStringLiteral("uber") << two;
        QTest::addRow("every word must match") << QStringLiteral("meet cafe") << none;
        QTest::addRow("two words") << QStringLiteral("tomorrow meet") << one;
        QTest::addRow("punctuation only") << QStringLiteral("!?") << none;
        QTest::addRow("quotes are text") << QStringLiteral("\"meet") << one;
        QTest::addRow("FTS5 syntax is text") << QStringLiteral("meet OR NOT cafe*") << none;
        QTest::addRow("fullwidth") << QStringLiteral("ＭＥＥＴ") << one;
    }
    void latin_words_match_by_prefix_without_case_or_accents() {
        QFETCH(QString, query);
        QFETCH(QStringList, expected);
        const QString c = QStringLiteral("c1");
        QVERIFY(store_->applyPage(page(c, {msg(c, 1, QStringLiteral("Meeting tomorrow at 10")),
                                           msg(c, 2, QStringLiteral("Café crème, über alles"))})));
        QCOMPARE(find(query), expected);
    }

    void results_come_newest_first_in_pages() {
        // Two conversations interleaved in time; pages of 7 from `position`.
        QList<proto::Event> a, b;
        for (int i = 1; i <= 20; ++i) {
            proto::Event e = msg(QStringLiteral("a"), i, QStringLiteral("note %1").arg(i));
            e.ts = kT0 + i * 2000;
            a << e;
            proto::Event f = msg(QStringLiteral("b"), i, QStringLiteral("note b%1").arg(i));
            f.ts = kT0 + i * 2000 + 1000;
            b << f;
        }
        QVERIFY(store_->applyPage(page(QStringLiteral("a"), a)));
        QVERIFY(store_->applyPage(page(QStringLiteral("b"), b)));
        QList<qint64> ts;
        qint64 before = 0;
        QString error;
        for (;;) {
            const auto found = im::detail::runSearch(*reader_, QStringLiteral("note"), {}, 7, before, &error);
            QVERIFY2(found, qPrintable(error));
            if (found->isEmpty())
                break;
            for (const im::SearchResult &r : *found)
                ts << r.ts();
            before = found->last().position();
        }
        QCOMPARE(ts.size(), 40);
        for (int i = 1; i < ts.size(); ++i)
            QVERIFY(ts.at(i - 1) > ts.at(i));
        // One conversation only.
        QCOMPARE(find(QStringLiteral("note"), QStringLiteral("b")).size(), 20);
        QCOMPARE(find(QStringLiteral("note"), QStringLiteral("b")).first(), QStringLiteral("b:20"));
        // Same commit time in two conversations: both found.
        QVERIFY(store_->applyPage(page(QStringLiteral("x"), {msg(QStringLiteral("x"), 21, QStringLiteral("twin"))})));
        QVERIFY(store_->applyPage(page(QStringLiteral("y"), {msg(QStringLiteral("y"), 21, QStringLiteral("twin"))})));
        QCOMPARE(find(QStringLiteral("twin")).size(), 2);
    }

    void matched_ranges_and_snippets_point_into_the_text() {
        const QList<st::Term> t = st::terms(QStringLiteral("cafe 明天"));
        const QString text = QStringLiteral("Café? 我们明天见 CAFETERIA decafe");
        const QList<st::Range> r = st::matchedRanges(text, t);
        QCOMPARE(r.size(), 3);
        QCOMPARE(text.mid(r.at(0).start, r.at(0).length), QStringLiteral("Café"));
        QCOMPARE(text.mid(r.at(1).start, r.at(1).length), QStringLiteral("明天"));
        QCOMPARE(text.mid(r.at(2).start, r.at(2).length), QStringLiteral("CAFE"));
        // A long text: one line around the first match, ranges moved along.
        const QString longText = QString(300, u'x') + QStringLiteral(" needle\nhere ") + QString(300, u'y');
        const QList<st::Range> lr = st::matchedRanges(longText, st::terms(QStringLiteral("needle")));
        const st::Snippet s = st::snippet(longText, lr, 60);
        QCOMPARE(s.ranges.size(), 1);
        QCOMPARE(s.text.mid(s.ranges.at(0).start, s.ranges.at(0).length), QStringLiteral("needle"));
        QVERIFY(s.text.startsWith(QStringLiteral("\u2026")) && s.text.endsWith(QStringLiteral("\u2026")));
        QVERIFY(!s.text.contains(u'\n'));
    }

    void coverage_names_the_conversations_with_history_missing() {
        // c1 synced completely; c2 opened by its newest window (a gap below);
        // c3 behind its head; c4 purged before we saw it.
        QVERIFY(store_->applyPage(page(QStringLiteral("c1"), {msg(QStringLiteral("c1"), 1, QStringLiteral("a"))})));
        proto::Page w = page(QStringLiteral("c2"), {msg(QStringLiteral("c2"), 90, QStringLiteral("b"))});
        w.history = true;
        w.oldest = 90;
        w.hasOlder = true;
        QVERIFY(store_->applyWindow(w, 0, 1));
        QVERIFY(store_->applyPage(page(QStringLiteral("c3"), {msg(QStringLiteral("c3"), 1, QStringLiteral("c"))})));
        QVERIFY(store_->updateHead(QStringLiteral("c3"), 5));
        proto::Page p4 = page(QStringLiteral("c4"), {msg(QStringLiteral("c4"), 11, QStringLiteral("d"))});
        p4.minSeq = 11;
        p4.trimmed = true;
        QVERIFY(store_->applyPage(p4));
        const auto cov = reader_->coverage({});
        QVERIFY2(cov, qPrintable(reader_->lastError()));
        QStringList loadable, purged;
        for (const im::detail::ConvCoverage &c : *cov) {
            if (c.loadable())
                loadable << c.conv;
            if (c.purged > 0)
                purged << c.conv;
        }
        QCOMPARE(loadable, (QStringList{QStringLiteral("c2"), QStringLiteral("c3")}));
        QCOMPARE(purged, QStringList{QStringLiteral("c4")});
        QCOMPARE(reader_->coverage(QStringLiteral("c1"))->size(), 0);
        // The gap filled: c2 is complete.
        proto::Page older = page(QStringLiteral("c2"), {msg(QStringLiteral("c2"), 1, QStringLiteral("old"))});
        older.history = true;
        older.oldest = 1;
        QVERIFY(store_->applyWindow(older, 90, 1));
        QCOMPARE(reader_->coverage(QStringLiteral("c2"))->size(), 0);
        QCOMPARE(find(QStringLiteral("old")), QStringList{QStringLiteral("c2:1")});
    }

    void a_failed_page_leaves_neither_events_nor_index() {
        const QString c = QStringLiteral("c1");
        QVERIFY(store_->applyPage(page(c, {msg(c, 1, QStringLiteral("alpha gamble"))})));
        // Every write statement of the next page in turn fails: whatever
        // statement fails, nothing of the page is stored or indexed.
        for (int n = 1;; ++n) {
            store_->injectFaultAfter(n);
            const bool ok = store_->applyPage(
                page(c, {change(QStringLiteral("edit"), c, 2, 1, QStringLiteral("beta")), msg(c, 3, QStringLiteral("gamma"))}));
            if (ok) {
                store_->injectFaultAfter(0);
                break;
            }
            QCOMPARE(find(QStringLiteral("alpha")), QStringList{QStringLiteral("c1:1")});
            QCOMPARE(find(QStringLiteral("beta")), QStringList());
            QCOMPARE(find(QStringLiteral("gamma")), QStringList());
            QVERIFY(indexIntact());
            QVERIFY(n < 100);
        }
        QCOMPARE(find(QStringLiteral("beta")), QStringList{QStringLiteral("c1:1")});
        QCOMPARE(find(QStringLiteral("gamma")), QStringList{QStringLiteral("c1:3")});
        // The vocabulary took "gamma" with the page that stored it, after
        // the failed tries (a rolled-back word is written again): the
        // prefix finds it beside the stale "gamble".
        QCOMPARE(find(QStringLiteral("gam")), QStringList{QStringLiteral("c1:3")});
    }

    void a_last_word_is_searched_as_the_whole_words_it_stands_for() {
        const QString c = QStringLiteral("c1");
        QVERIFY(store_->applyPage(page(c, {msg(c, 1, QStringLiteral("Straße und strange Dinge")),
                                           msg(c, 2, QStringLiteral("a stray cat")),
                                           msg(c, 3, QStringLiteral("NAÏVE idea")),
                                           msg(c, 4, QStringLiteral("meet me at the station"))})));
        const auto vocab = reader_->vocabulary(QStringLiteral("st"), 10);
        QVERIFY(vocab);
        QCOMPARE(*vocab, (QStringList{QStringLiteral("station"), QStringLiteral("stra") + QChar(1),
                                      QStringLiteral("strange"), QStringLiteral("stray")}));
        QCOMPARE(find(QStringLiteral("stra")), (QStringList{QStringLiteral("c1:2"), QStringLiteral("c1:1")}));
        QCOMPARE(find(QStringLiteral("Straß")), QStringList{QStringLiteral("c1:1")});
        QCOMPARE(find(QStringLiteral("st")), (QStringList{QStringLiteral("c1:4"), QStringLiteral("c1:2"),
                                                           QStringLiteral("c1:1")}));
        QCOMPARE(find(QStringLiteral("nai")), QStringList{QStringLiteral("c1:3")});
        QCOMPARE(find(QStringLiteral("at the sta")), QStringList{QStringLiteral("c1:4")});
        QCOMPARE(find(QStringLiteral("the st")), QStringList{QStringLiteral("c1:4")});
        QCOMPARE(find(QStringLiteral("stx")), QStringList());
        // More words than an expansion takes: FTS5's prefix, same results.
        QList<proto::Event> many;
        for (int i = 1; i <= 250; ++i)
            many << msg(c, 4 + i, QStringLiteral("wa%1").arg(i, 4, 10, QChar(u'0')));
        QVERIFY(store_->applyPage(page(c, many)));
        QVERIFY(!reader_->vocabulary(QStringLiteral("wa"), 200));
        QCOMPARE(find(QStringLiteral("wa"), {}, 300).size(), 250);
        QCOMPARE(find(QStringLiteral("wa"), {}, 1), QStringList{QStringLiteral("c1:254")});
        QCOMPARE(find(QStringLiteral("wa02")).size(), 51); // wa0200..wa0250
    }

    void an_older_store_is_indexed_in_resumable_batches() {
        // A schema 5 store (the released fixture) with 1,000 more messages.
        cleanup();
        const QString path = dir_.filePath(QStringLiteral("old.db"));
        const QString loaded = loadFixture(5, path);
        QVERIFY2(loaded.isEmpty(), qPrintable(loaded));
        QStringList rows{QStringLiteral("BEGIN")};
        for (int i = 1; i <= 1000; ++i)
            rows << QStringLiteral("INSERT INTO events(conv, seq, mid, kind, sender, body, ts, epoch)"
                                   " VALUES('big', %1, 'm%1', 'msg', 'cy', 'bulk %2 message', %3, 1)")
                        .arg(i)
                        .arg(i == 1 ? QStringLiteral("first") : i == 1000 ? QStringLiteral("last") : QStringLiteral("middle"))
                        .arg(kT0 + i);
        rows << QStringLiteral("COMMIT");
        QVERIFY2(sqlExec(path, rows).isEmpty(), "fixture");

        store_ = std::make_unique<Storage>();
        QVERIFY2(store_->open(path), qPrintable(store_->lastError()));
        QCOMPARE(store_->schemaVersion(), Storage::SchemaVersion);
        QCOMPARE(store_->searchIndexComplete().value_or(true), false);
        // One bounded batch (budget 0: one slice of 200), then the app quits.
        auto step = store_->buildSearchIndex(0);
        QVERIFY(step && !step->finished);
        QCOMPARE(step->done, 200);
        QCOMPARE(step->total, 1027);
        store_.reset();
        // Reopened: the build resumes where it stopped, never indexes twice.
        store_ = std::make_unique<Storage>();
        QVERIFY2(store_->open(path), qPrintable(store_->lastError()));
        int batches = 0;
        do {
            step = store_->buildSearchIndex(0);
            QVERIFY(step);
            ++batches;
        } while (!step->finished);
        QCOMPARE(step->done, 1027);
        QCOMPARE(batches, 5);
        QCOMPARE(store_->searchIndexComplete().value_or(false), true);
        // Then the segments the batches left (one per transaction, some
        // merged by FTS5 as it goes) are merged into one, a step at a time.
        QVERIFY(sqlValue(path, QStringLiteral("SELECT COUNT(DISTINCT segid) FROM search_idx")).toInt() > 1);
        QCOMPARE(store_->searchIndexSettled().value_or(true), false);
        while (!step->settled) {
            step = store_->buildSearchIndex(0);
            QVERIFY(step && step->finished);
            QVERIFY(++batches < 1000);
        }
        QCOMPARE(store_->searchIndexSettled().value_or(false), true);
        QCOMPARE(sqlValue(path, QStringLiteral("SELECT COUNT(DISTINCT segid) FROM search_idx")).toInt(), 1);
        QVariant count;
        QVERIFY(sqlExec(path, {QStringLiteral("SELECT COUNT(*) FROM events WHERE kind = 'msg' AND search_id IS NULL")},
                        &count).isEmpty());
        QCOMPARE(count.toInt(), 0);
        reader_ = std::make_unique<SearchReader>(path);
        QCOMPARE(find(QStringLiteral("bulk first")), QStringList{QStringLiteral("big:1")});
        QCOMPARE(find(QStringLiteral("bulk last")), QStringList{QStringLiteral("big:1000")});
        QCOMPARE(find(QStringLiteral("c2 message")).size(), 20);
        // The store stays usable meanwhile and after: new pages are indexed.
        QVERIFY(store_->applyPage(page(QStringLiteral("big"), {msg(QStringLiteral("big"), 1001, QStringLiteral("bulk newest"))})));
        QCOMPARE(find(QStringLiteral("bulk")).first(), QStringLiteral("big:1001"));
        reader_.reset();
        store_.reset();
        init();
    }

    void the_index_merges_sixteen_segments_at_a_time() {
        // Schema 10: FTS5's automerge is 16 (its default, 4, merged a
        // level every fourth page commit, inside that page's transaction),
        // in a new store and in one upgraded from schema 9.
        const QString automerge = QStringLiteral("SELECT v FROM search_config WHERE k = 'automerge'");
        QCOMPARE(sqlValue(path_, automerge).toInt(), 16);
        cleanup();
        const QString path = dir_.filePath(QStringLiteral("v9.db"));
        const QString loaded = loadFixture(9, path);
        QVERIFY2(loaded.isEmpty(), qPrintable(loaded));
        QVERIFY(sqlValue(path, automerge).isNull()); // FTS5's default
        {
            Storage upgraded;
            QVERIFY2(upgraded.open(path), qPrintable(upgraded.lastError()));
            QCOMPARE(upgraded.schemaVersion(), Storage::SchemaVersion);
        }
        QCOMPARE(sqlValue(path, automerge).toInt(), 16);
        init();
    }

    void a_schema_6_index_is_rebuilt_in_the_new_format_and_merged() {
        // A schema 6 store whose index was built (ids ts * 2^20 + seq, as
        // schema 6 made them): schema 7 drops it, builds it again in the
        // background (ids ts * 16 + low) and merges the segments after.
        cleanup();
        const QString path = dir_.filePath(QStringLiteral("v6.db"));
        const QString loaded = loadFixture(6, path);
        QVERIFY2(loaded.isEmpty(), qPrintable(loaded));
        QStringList rows{QStringLiteral("BEGIN")};
        rows << QStringLiteral("INSERT INTO events(conv, seq, mid, kind, sender, body, ts, epoch) VALUES('c1', 8,"
                               " 'm-c1-8', 'msg', 'ben', '我们明天开会', %1, 3)").arg(kT0 + 8);
        rows << QStringLiteral("UPDATE events SET search_id = ts * 1048576 + seq WHERE kind = 'msg'");
        rows << QStringLiteral("INSERT INTO search(rowid, body, conv) SELECT search_id, body, 'c' || conv FROM events"
                               " WHERE search_id IS NOT NULL");
        rows << QStringLiteral("UPDATE meta SET value = 'done' WHERE key = 'search_build'");
        rows << QStringLiteral("COMMIT");
        QVERIFY2(sqlExec(path, rows).isEmpty(), "fixture");

        store_ = std::make_unique<Storage>();
        QVERIFY2(store_->open(path), qPrintable(store_->lastError()));
        QCOMPARE(store_->schemaVersion(), Storage::SchemaVersion);
        QCOMPARE(store_->searchIndexComplete().value_or(true), false);
        QCOMPARE(store_->searchIdOf(QStringLiteral("c1"), 8), 0);
        reader_ = std::make_unique<SearchReader>(path);
        QCOMPARE(find(QStringLiteral("c1 message")), QStringList()); // the old index is gone
        // Each step a bounded batch (budget 0: one slice, one merge step).
        std::optional<Storage::IndexBuild> step;
        int steps = 0;
        do {
            step = store_->buildSearchIndex(0);
            QVERIFY(step);
            QVERIFY(++steps < 1000);
            if (step->finished)
                QCOMPARE(store_->searchIndexComplete().value_or(false), true);
        } while (!step->settled);
        QCOMPARE(step->done, 28);
        QCOMPARE(store_->searchIndexSettled().value_or(false), true);
        QCOMPARE(store_->searchIdOf(QStringLiteral("c1"), 8), (kT0 + 8) * 16 + 8);
        QCOMPARE(store_->searchIdOf(QStringLiteral("c2"), 120), sqlValue(path, QStringLiteral(
            "SELECT ts * 16 + 120 % 16 FROM events WHERE conv = 'c2' AND seq = 120")).toLongLong());
        QCOMPARE(find(QStringLiteral("明天")), QStringList{QStringLiteral("c1:8")});
        QCOMPARE(find(QStringLiteral("c1 message")).size(), 7);
        QCOMPARE(find(QStringLiteral("message 120")), QStringList{QStringLiteral("c2:120")});
        reader_.reset();
        store_.reset();
        init();
    }

    void index_text_and_vocabulary_are_written_as_schema_7_wrote_them() {
        // One pass each since idx51b (they run for every stored message):
        // the same output as the run-based reference above, on fixed cases
        // and on random mixes of scripts, surrogates, marks and punctuation.
        QCOMPARE(st::indexText(QStringLiteral("见面 at 5点半!")), QStringLiteral(" 见面 面  at 5 点半 半 !"));
        QCOMPARE(st::vocabTerms(QStringLiteral("Straße STRASSE straße 见面x Café")),
                 (QStringList{QStringLiteral("stra") + st::VocabPrefixMark, QStringLiteral("strasse"),
                              QStringLiteral("x"), QStringLiteral("cafe")}));
        const QStringList pool{QStringLiteral("a"), QStringLiteral("Z"), QStringLiteral("7"), QStringLiteral(" "),
                               QStringLiteral(","), QStringLiteral("\n"), QStringLiteral("é"), QStringLiteral("ß"),
                               QStringLiteral("Å"), QStringLiteral("e\u0301"), QStringLiteral("中"), QStringLiteral("文"),
                               QStringLiteral("，"), QStringLiteral("\U00020000"), QStringLiteral("한"),
                               QStringLiteral("ー"), QStringLiteral("々"), QStringLiteral("ｶ"), QStringLiteral("Ａ"),
                               QStringLiteral("\u00BD"), QStringLiteral("\U0001F600"), QString(QChar(0xD800)),
                               QStringLiteral("\uE000"), QStringLiteral("ж"), QStringLiteral("İ")};
        QRandomGenerator rng(51);
        for (int n = 0; n < 3000; ++n) {
            QString text;
            const int len = int(rng.bounded(14u));
            for (int i = 0; i < len; ++i)
                text += pool.at(int(rng.bounded(quint32(pool.size()))));
            QCOMPARE(st::indexText(text), reference::indexText(text));
            QCOMPARE(st::vocabTerms(text), reference::vocabTerms(text));
        }
    }

    void ids_colliding_in_a_millisecond_take_the_next_free_one() {
        // More than 16 messages with one commit time: each gets its own id
        // (the next free one above), all are found, the index stays sound.
        QList<proto::Event> events;
        for (int i = 1; i <= 40; ++i) {
            proto::Event e = msg(QStringLiteral("c1"), i, QStringLiteral("burst %1").arg(i));
            e.ts = kT0;
            events << e;
        }
        QVERIFY(store_->applyPage(page(QStringLiteral("c1"), events)));
        QSet<qint64> ids;
        for (int i = 1; i <= 40; ++i)
            ids.insert(store_->searchIdOf(QStringLiteral("c1"), i));
        QCOMPARE(ids.size(), 40);
        QVERIFY(!ids.contains(0));
        QCOMPARE(find(QStringLiteral("burst")).size(), 40);
    }

    // A page's looks before its upserts are read once for the page
    // (Storage::lookAhead, issue 51's page apply): what they say must be
    // what the per-event look would have said.
    void a_page_look_sees_the_ids_other_conversations_took_in_its_milliseconds() {
        // c2's messages share c1's commit times and seq low bits: their
        // first ids are taken by c1's, in the store before the page.
        QList<proto::Event> one, two;
        for (int i = 1; i <= 5; ++i) {
            proto::Event a = msg(QStringLiteral("c1"), i, QStringLiteral("alpha %1").arg(i));
            proto::Event b = msg(QStringLiteral("c2"), i, QStringLiteral("alpha %1").arg(i));
            a.ts = b.ts = kT0 + i;
            one << a;
            two << b;
        }
        QVERIFY(store_->applyPage(page(QStringLiteral("c1"), one)));
        QVERIFY(store_->applyPage(page(QStringLiteral("c2"), two)));
        QSet<qint64> ids;
        for (int i = 1; i <= 5; ++i)
            ids << store_->searchIdOf(QStringLiteral("c1"), i) << store_->searchIdOf(QStringLiteral("c2"), i);
        QCOMPARE(ids.size(), 10);
        QVERIFY(!ids.contains(0));
        QCOMPARE(find(QStringLiteral("alpha")).size(), 10);
        QCOMPARE(find(QStringLiteral("alpha"), QStringLiteral("c2")).size(), 5);
    }

    void a_page_look_keeps_stored_rows_recalls_and_repeats_apart() {
        const QString c = QStringLiteral("c1");
        QVERIFY(store_->applyPage(page(c, {msg(c, 2, QStringLiteral("kept words")),
                                           change(QStringLiteral("recall"), c, 9, 4)})));
        // One page: a stored row (re-applied with an edit), a new one, one
        // whose recall is stored, one recalled by a later event of the page
        // that comes first (out of order), and a seq twice.
        proto::Event edited = msg(c, 2, QStringLiteral("kept words"));
        edited.editSeq = 8;
        edited.editBody = QStringLiteral("changed words");
        QVERIFY(store_->applyPage(page(c, {change(QStringLiteral("recall"), c, 7, 5), msg(c, 1, QStringLiteral("fresh words")),
                                           edited, msg(c, 3, QStringLiteral("twice words")),
                                           msg(c, 3, QStringLiteral("twice words")),
                                           msg(c, 4, QStringLiteral("gone words")),
                                           msg(c, 5, QStringLiteral("late words"))})));
        QCOMPARE(find(QStringLiteral("words")),
                 (QStringList{QStringLiteral("c1:3"), QStringLiteral("c1:2"), QStringLiteral("c1:1")}));
        QCOMPARE(find(QStringLiteral("kept")), QStringList());
        QCOMPARE(find(QStringLiteral("changed")), QStringList{QStringLiteral("c1:2")});
        QCOMPARE(store_->searchIdOf(c, 4), 0);
        QCOMPARE(store_->searchIdOf(c, 5), 0);
    }

    void a_page_that_changes_its_own_new_messages_keeps_the_index_sound() {
        // A page's new index rows go in together (one FTS5 insert at the
        // page's end); an edit or a recall of one of them later in the same
        // page must find it in the index. Quotes, backslashes, tabs and
        // newlines travel through that insert unchanged (a contentless
        // index deletes by the very text: the edit below deletes it).
        const QString c = QStringLiteral("c1");
        const QString odd = QStringLiteral("say \"odd\" \\ back\tslash\nline");
        QVERIFY(store_->applyPage(page(c, {msg(c, 1, QStringLiteral("first draft")), msg(c, 2, odd),
                                           msg(c, 3, QStringLiteral("doomed note")), msg(c, 4, QStringLiteral("plain note")),
                                           change(QStringLiteral("edit"), c, 5, 1, QStringLiteral("final text")),
                                           change(QStringLiteral("recall"), c, 6, 3)})));
        QCOMPARE(find(QStringLiteral("draft")), QStringList());
        QCOMPARE(find(QStringLiteral("final")), QStringList{QStringLiteral("c1:1")});
        QCOMPARE(find(QStringLiteral("doomed")), QStringList());
        QCOMPARE(find(QStringLiteral("note")), QStringList{QStringLiteral("c1:4")});
        QCOMPARE(find(QStringLiteral("slash line")), QStringList{QStringLiteral("c1:2")});
        QVERIFY(indexIntact());
        QVERIFY(store_->applyPage(page(c, {change(QStringLiteral("edit"), c, 7, 2, QStringLiteral("even")),
                                           msg(c, 8, QStringLiteral("after"))})));
        QCOMPARE(find(QStringLiteral("odd")), QStringList());
        QCOMPARE(find(QStringLiteral("even")), QStringList{QStringLiteral("c1:2")});
    }

    void the_model_searches_on_its_thread_pages_and_follows_the_index_build() {
        // A schema 5 store: Client::open() builds its index in the
        // background; the model searches meanwhile and again when done.
        cleanup();
        const QString path = dir_.filePath(QStringLiteral("model.db"));
        QVERIFY(loadFixture(5, path).isEmpty());
        QStringList rows{QStringLiteral("BEGIN")};
        for (int i = 1; i <= 3000; ++i)
            rows << QStringLiteral("INSERT INTO events(conv, seq, mid, kind, sender, body, ts, epoch)"
                                   " VALUES('big', %1, 'm%1', 'msg', 'cy', 'row %1 of the 周五 report', %2, 1)")
                        .arg(i)
                        .arg(kT0 + i);
        rows << QStringLiteral("COMMIT");
        QVERIFY(sqlExec(path, rows).isEmpty());
        im::Client client;
        QVERIFY2(client.open(path), qPrintable(client.lastError()));
        QVERIFY(client.searchIndexProgress() < 1.0);
        im::SearchModel model(&client);
        model.setPageSize(40);
        model.setQuery(QStringLiteral("周五 REP"));
        QTRY_COMPARE_WITH_TIMEOUT(client.searchIndexProgress(), 1.0, 30000);
        QTRY_VERIFY(!model.isSearching() && model.count() == 40);
        QVERIFY(!model.isIndexing());
        QCOMPARE(model.data(model.index(0), im::SearchModel::SeqRole).toLongLong(), 3000);
        QCOMPARE(model.data(model.index(0), im::SearchModel::BodyRole).toString(), QStringLiteral("row 3000 of the 周五 report"));
        const QVariantList m = model.data(model.index(0), im::SearchModel::MatchesRole).toList();
        QCOMPARE(m.size(), 2);
        QCOMPARE(m.at(0).toMap().value(QStringLiteral("start")).toInt(), 16);
        QCOMPARE(m.at(0).toMap().value(QStringLiteral("length")).toInt(), 2);
        QCOMPARE(m.at(1).toMap().value(QStringLiteral("length")).toInt(), 3);
        QVERIFY(model.canFetchMore());
        model.fetchMore();
        QVERIFY(model.isSearching());
        QTRY_COMPARE(model.count(), 80);
        QCOMPARE(model.result(79).seq(), 2921);
        // Coverage: the fixture's c2 has a window gap, c1 is behind its head.
        QCOMPARE(model.incompleteConversations(), (QStringList{QStringLiteral("c1"), QStringLiteral("c2")}));
        QCOMPARE(model.purgedConversations(), QStringList{QStringLiteral("c2")});
        model.setConversation(QStringLiteral("big"));
        QTRY_VERIFY(!model.isSearching() && model.count() == 40);
        QCOMPARE(model.incompleteConversations(), QStringList());
        // Client::search without a view.
        QSignalSpy answers(&client, &im::Client::searchFinished);
        const int id = client.search(QStringLiteral("report"), QStringLiteral("big"), 5);
        QTRY_COMPARE(answers.size(), 1);
        QCOMPARE(answers.at(0).at(0).toInt(), id);
        QCOMPARE(answers.at(0).at(1).value<QList<im::SearchResult>>().size(), 5);
        QCOMPARE(answers.at(0).at(2).toBool(), true);
        model.setQuery(QString());
        QCOMPARE(model.count(), 0);
        client.close();
        init();
    }
};

QTEST_GUILESS_MAIN(TestSearch)
#include "tst_search.moc"
