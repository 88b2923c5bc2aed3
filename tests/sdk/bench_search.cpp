// On-device search benchmark (issue 51; not a timed test: it prints figures,
// docs/benchmarks.md "On-device search" has them).
//
//  1. A store of N messages (default 1,000,000; mixed English and Chinese
//     of realistic lengths, 200 conversations) written directly with SQL in
//     one transaction, as a store of an SDK before schema 6 left it (no
//     index), then opened: the index build (Storage::buildSearchIndex in
//     the Client's bounded batches) timed, with its progress.
//  2. Store size with the index against without (pages in use, WAL
//     checkpointed).
//  3. First page (50 results) of a query on the search thread's reader
//     connection, highlights and snippets included: p50/p99 over mixed
//     queries (words, prefixes, two words), and over two-character Chinese
//     queries apart.
//  4. Applying a page of 200 new events (Storage::applyPage) with the index
//     upkeep against without it, alternating, into the big store: the
//     ratio of the medians.
//
// Usage: bench_search [--messages N] [--dir DIR] [--queries N] [--pages N]
//        [--reuse] (with --dir: the store a run before left there, its index
//        built: straight to the measures) [--apply-only] (only 4: a profiler's run)
//        [--side with|without|both] (4 with the index upkeep only, without it
//        only, or both alternating: the default; one side for callgrind)
//        IM_BENCH_SMALL=1 (or --messages 20000): the CI bench stage's size.
#include "searchreader_p.h"
#include "searchservice_p.h"
#include "storage_p.h"

#include <QtCore/QCommandLineParser>
#include <QtCore/QCoreApplication>
#include <QtCore/QElapsedTimer>
#include <QtCore/QFileInfo>
#include <QtCore/QRandomGenerator>
#include <QtCore/QTemporaryDir>
#include <QtSql/QSqlDatabase>
#include <QtSql/QSqlError>
#include <QtSql/QSqlQuery>

#include <algorithm>
#include <cstdio>
#include <ctime>
#include <vector>

namespace {

using im::detail::Storage;
namespace proto = im::proto;

constexpr qint64 kT0 = 1767225600000; // 2026-01-01

const QStringList &englishWords() {
    static const QStringList words = QStringLiteral(
        "the be to of and a in that have I it for not on with he as you do at this but his by from they we say her "
        "she or an will my one all would there their what so up out if about who get which go me when make can like "
        "time no just him know take people into year your good some could them see other than then now look only "
        "come its over think also back after use two how our work first well way even new want because any these "
        "give day most us meeting tomorrow release server client deploy review budget project schedule lunch dinner "
        "invoice contract design sprint backlog ticket customer support weekend holiday airport train hotel report "
        "draft slides agenda minutes quarter revenue forecast hiring interview candidate offer launch feature bug fix "
        "crash latency database migration backup restore password account login update version android iphone "
        "laptop monitor keyboard coffee pizza birthday party photo video music movie football weather rain snow")
        .split(u' ');
    return words;
}

const QString &chineseChars() {
    static const QString chars = QStringLiteral(
        "的一是在不了有和人这中大为上个国我以要他时来用们生到作地于出就分对成会可主发年动同工也能下过子说产种面而方"
        "后多定行学法所民得经十三之进着等部度家电力里如水化高自二理起小物现实加量都两体制机当使点从业本去把性好应开它"
        "合还因由其些然前外天政四日那社义事平形相全表间样与关各重新线内数正心反你明看原又么利比或但质气第向道命此变条"
        "只没结解问意建月公无系军很情者最立代想已通并提直题党程展五果料象员革位入常文总次品式活设及管特件长求老头基资"
        "边流路级少图山统接知较将组见计别她手角期根论运农指几九区强放决西被干做必战先回则任取据处队南给色光门即保治北"
        "造百规热领七海口东导器压志世金增争济阶油思术极交受联什认六共权收证改清己美再采转更单风切打白教速花带安场身车"
        "例真务具万每目至达走积示议声报斗完类八离华名确才科张信马节话米整空元况今集温传土许步群广石记需段研界拉林律叫"
        "且究观越织装影算低持音众书布复容儿须际商非验连断深难近矿千周委素技备半办青省列习响约支般史感劳便团往酸历市克"
        "何除消构府称太准精值号率族维划选标写存候毛亲快效斯院查江型眼王按格养易置派层片始却专状育厂京识适属圆包火住调"
        "满县局照参红细引听该铁价严龙飞");
    return chars;
}

QString englishText(QRandomGenerator &rng) {
    const QStringList &w = englishWords();
    const int n = 3 + int(rng.bounded(23)); // 3..25 words
    QStringList out;
    for (int i = 0; i < n; ++i) {
        // Zipf-like: the list starts with the common words.
        const double u = rng.generateDouble();
        out << w.at(std::min<int>(int(w.size()) - 1, int(u * u * double(w.size()))));
    }
    QString s = out.join(u' ');
    s[0] = s[0].toUpper();
    return s + (rng.bounded(4) == 0 ? QStringLiteral("?") : QStringLiteral("."));
}

QString chineseText(QRandomGenerator &rng) {
    const QString &c = chineseChars();
    const int n = 4 + int(rng.bounded(37)); // 4..40 characters
    QString s;
    for (int i = 0; i < n; ++i) {
        const double u = rng.generateDouble();
        s += c.at(std::min<int>(int(c.size()) - 1, int(u * u * double(c.size()))));
        if (i > 0 && i + 1 < n && rng.bounded(9) == 0)
            s += QStringLiteral("，");
    }
    return s + QStringLiteral("。");
}

QString messageText(QRandomGenerator &rng) {
    const quint32 k = rng.bounded(10);
    if (k < 5)
        return englishText(rng);
    if (k < 9)
        return chineseText(rng);
    return chineseText(rng) + u' ' + englishText(rng); // mixed
}

double ms(qint64 ns) { return double(ns) / 1e6; }

// CPU time of this process (one thread does the work): on a shared
// machine the wall clock also counts the other processes' turns.
qint64 cpuNs() {
    timespec t{};
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return qint64(t.tv_sec) * 1000000000 + t.tv_nsec;
}

struct Pct {
    double p50 = 0, p99 = 0, max = 0, mean = 0;
};
Pct pct(std::vector<qint64> ns) {
    Pct p;
    if (ns.empty())
        return p;
    std::sort(ns.begin(), ns.end());
    p.p50 = ms(ns[ns.size() / 2]);
    p.p99 = ms(ns[std::min(ns.size() - 1, ns.size() * 99 / 100)]);
    p.max = ms(ns.back());
    qint64 sum = 0;
    for (const qint64 v : ns)
        sum += v;
    p.mean = ms(sum) / double(ns.size());
    return p;
}

bool fail(const QString &what) {
    std::fprintf(stderr, "bench_search: %s\n", qPrintable(what));
    return false;
}

// Bytes of the pages in use (the WAL checkpointed into the file first).
qint64 usedBytes(const QString &path) {
    qint64 out = -1;
    {
        QSqlDatabase db = QSqlDatabase::addDatabase(QStringLiteral("QSQLITE"), QStringLiteral("size"));
        db.setDatabaseName(path);
        if (db.open()) {
            QSqlQuery q(db);
            q.exec(QStringLiteral("PRAGMA wal_checkpoint(TRUNCATE)"));
            qint64 pages = 0, free = 0, size = 0;
            if (q.exec(QStringLiteral("PRAGMA page_count")) && q.next())
                pages = q.value(0).toLongLong();
            if (q.exec(QStringLiteral("PRAGMA freelist_count")) && q.next())
                free = q.value(0).toLongLong();
            if (q.exec(QStringLiteral("PRAGMA page_size")) && q.next())
                size = q.value(0).toLongLong();
            out = (pages - free) * size;
        }
        db.close();
    }
    QSqlDatabase::removeDatabase(QStringLiteral("size"));
    return out;
}

// Writes N messages the way a store of schema 5 held them (no index).
bool generate(const QString &path, int messages, int convs, QRandomGenerator &rng, QStringList *samples) {
    {
        Storage s; // creates schema 6 (empty: the build is 'done')
        if (!s.open(path))
            return fail(s.lastError());
        if (!s.setMeta(QStringLiteral("user"), QStringLiteral("ana")))
            return fail(s.lastError());
    }
    bool ok = true;
    {
        QSqlDatabase db = QSqlDatabase::addDatabase(QStringLiteral("QSQLITE"), QStringLiteral("gen"));
        db.setDatabaseName(path);
        ok = db.open();
        QSqlQuery q(db);
        ok = ok && q.exec(QStringLiteral("PRAGMA synchronous=OFF")) && q.exec(QStringLiteral("BEGIN"));
        QSqlQuery e(db);
        e.prepare(QStringLiteral("INSERT INTO events(conv, seq, mid, kind, sender, body, ts, epoch)"
                                 " VALUES(?, ?, ?, 'msg', ?, ?, ?, 1)"));
        std::vector<qint64> seqs(size_t(convs), 0);
        for (int i = 0; ok && i < messages; ++i) {
            const int c = int(rng.bounded(quint32(convs)));
            const qint64 seq = ++seqs[size_t(c)];
            const QString body = messageText(rng);
            if (samples && rng.bounded(quint32(std::max(1, messages / 400))) == 0)
                *samples << body;
            e.bindValue(0, QStringLiteral("conv-%1").arg(c));
            e.bindValue(1, seq);
            e.bindValue(2, QStringLiteral("m%1").arg(i));
            e.bindValue(3, QStringLiteral("user%1").arg(rng.bounded(50)));
            e.bindValue(4, body);
            e.bindValue(5, kT0 + qint64(i) * 1000);
            ok = e.exec();
            if (!ok)
                fail(e.lastError().text());
        }
        QSqlQuery cq(db);
        cq.prepare(QStringLiteral("INSERT INTO conversations(conv, kind, epoch, after, head) VALUES(?, 'group', 1, ?, ?)"));
        for (int c = 0; ok && c < convs; ++c) {
            cq.bindValue(0, QStringLiteral("conv-%1").arg(c));
            cq.bindValue(1, seqs[size_t(c)]);
            cq.bindValue(2, seqs[size_t(c)]);
            ok = cq.exec();
        }
        // As an SDK before schema 6 left it: nothing indexed, the build to do.
        ok = ok && q.exec(QStringLiteral("UPDATE meta SET value = '' WHERE key = 'search_build'"))
             && q.exec(QStringLiteral("COMMIT"));
        if (!ok)
            fail(q.lastError().text());
        q = QSqlQuery();
        e = QSqlQuery();
        cq = QSqlQuery();
        db.close();
    }
    QSqlDatabase::removeDatabase(QStringLiteral("gen"));
    return ok;
}

// Queries that find something: words and prefixes of the vocabulary, two
// words, Chinese pairs and runs taken from stored messages.
void makeQueries(QRandomGenerator &rng, const QStringList &samples, int n, QStringList *mixed, QStringList *cjk2) {
    const QStringList &w = englishWords();
    for (int i = 0; i < n; ++i) {
        const QString word = w.at(int(rng.bounded(quint32(w.size()))));
        switch (i % 4) {
        case 0: *mixed << word; break;
        case 1: *mixed << word.left(std::max<qsizetype>(2, word.size() - 2)); break; // a prefix
        case 2: *mixed << word + u' ' + w.at(int(rng.bounded(quint32(w.size())))); break;
        default: {
            const QString s = samples.at(int(rng.bounded(quint32(samples.size()))));
            const qsizetype at = s.size() > 5 ? qsizetype(rng.bounded(quint32(s.size() - 4))) : 0;
            *mixed << s.mid(at, 3).trimmed();
        }
        }
    }
    const QString &c = chineseChars();
    for (int i = 0; i < n; ++i) {
        if (i % 2 == 0) {
            // A pair of common characters (found often: the long doclists).
            const QString pair = QString(c.at(int(rng.bounded(30u)))) + c.at(int(rng.bounded(30u)));
            *cjk2 << pair;
        } else {
            // Two adjacent Chinese characters of a stored message (always
            // found; never a punctuation mark: that would be a
            // one-character query, which the runs before idx51 measured).
            QString pair;
            for (int k = 0; k < 50 && pair.isEmpty(); ++k) {
                const QString s = samples.at(int(rng.bounded(quint32(samples.size()))));
                if (s.size() < 2)
                    continue;
                const qsizetype at = qsizetype(rng.bounded(quint32(s.size() - 1)));
                if (c.contains(s.at(at)) && c.contains(s.at(at + 1)))
                    pair = s.mid(at, 2);
            }
            *cjk2 << (pair.isEmpty() ? QString(c.at(0)) + c.at(1) : pair);
        }
    }
}

// The samples of a reused store: messages of it, about 1 in 400.
bool reusedSamples(const QString &path, QStringList *samples) {
    bool ok = false;
    {
        QSqlDatabase db = QSqlDatabase::addDatabase(QStringLiteral("QSQLITE"), QStringLiteral("samples"));
        db.setDatabaseName(path);
        QSqlQuery q(db);
        ok = db.open() && q.exec(QStringLiteral("SELECT body FROM events WHERE kind = 'msg' AND seq % 400 = 7"));
        while (ok && q.next())
            *samples << q.value(0).toString();
        if (!ok)
            fail(q.lastError().text());
        q = QSqlQuery();
        db.close();
    }
    QSqlDatabase::removeDatabase(QStringLiteral("samples"));
    return ok && !samples->isEmpty();
}

// Raises seq and ts above the store's largest (a reused store's earlier pages).
bool storedMax(const QString &path, qint64 *seq, qint64 *ts) {
    bool ok = false;
    {
        QSqlDatabase db = QSqlDatabase::addDatabase(QStringLiteral("QSQLITE"), QStringLiteral("max"));
        db.setDatabaseName(path);
        QSqlQuery q(db);
        ok = db.open() && q.exec(QStringLiteral("SELECT MAX(seq), MAX(ts) FROM events")) && q.next();
        if (ok) {
            *seq = std::max(*seq, q.value(0).toLongLong() + 1);
            *ts = std::max(*ts, q.value(1).toLongLong() + 1000);
        }
        q = QSqlQuery();
        db.close();
    }
    QSqlDatabase::removeDatabase(QStringLiteral("max"));
    return ok;
}

proto::Page newPage(const QString &conv, qint64 from, int count, qint64 ts, QRandomGenerator &rng) {
    proto::Page p;
    p.conv = conv;
    p.epoch = 1;
    for (int i = 0; i < count; ++i) {
        proto::Event e;
        e.conv = conv;
        e.seq = from + i;
        e.mid = QStringLiteral("bench-%1-%2").arg(conv).arg(e.seq);
        e.kind = QStringLiteral("msg");
        e.sender = QStringLiteral("user%1").arg(rng.bounded(50));
        e.body = messageText(rng);
        e.ts = ts + i;
        e.epoch = 1;
        p.events << e;
    }
    p.head = from + count - 1;
    p.nextAfter = p.head;
    return p;
}

} // namespace

int main(int argc, char **argv) {
    QCoreApplication app(argc, argv);
    QCommandLineParser cli;
    cli.addHelpOption();
    cli.addOption({QStringLiteral("messages"), QStringLiteral("stored messages (default 1000000)"), QStringLiteral("N")});
    cli.addOption({QStringLiteral("queries"), QStringLiteral("queries per kind (default 200)"), QStringLiteral("N")});
    cli.addOption({QStringLiteral("pages"), QStringLiteral("pages of 200 per side (default 30)"), QStringLiteral("N")});
    cli.addOption({QStringLiteral("dir"), QStringLiteral("where the store goes (default: a temporary folder)"),
                   QStringLiteral("DIR")});
    cli.addOption({QStringLiteral("reuse"), QStringLiteral("reuse the store a run with --dir left there (its index"
                                                           " built): no generation, no build")});
    cli.addOption({QStringLiteral("apply-only"), QStringLiteral("measure only the page apply (for a profiler)")});
    cli.addOption({QStringLiteral("side"), QStringLiteral("pages applied with the index upkeep, without, or both"
                                                          " alternating (default)"), QStringLiteral("with|without|both")});
    cli.process(app);
    const bool small = qEnvironmentVariableIsSet("IM_BENCH_SMALL");
    const int messages = cli.isSet(QStringLiteral("messages")) ? cli.value(QStringLiteral("messages")).toInt()
                         : small                               ? 20000
                                                               : 1000000;
    const int queries = cli.isSet(QStringLiteral("queries")) ? cli.value(QStringLiteral("queries")).toInt() : 200;
    const int pages = cli.isSet(QStringLiteral("pages")) ? cli.value(QStringLiteral("pages")).toInt() : 30;
    QTemporaryDir tmp;
    const QString dir = cli.isSet(QStringLiteral("dir")) ? cli.value(QStringLiteral("dir")) : tmp.path();
    const QString path = dir + QStringLiteral("/bench_search.db");
    const bool reuse = cli.isSet(QStringLiteral("reuse")) && QFileInfo::exists(path);
    const bool applyOnly = cli.isSet(QStringLiteral("apply-only"));
    if (!reuse) {
        QFile::remove(path);
        QFile::remove(path + QStringLiteral("-wal"));
        QFile::remove(path + QStringLiteral("-shm"));
    }
    QRandomGenerator rng(51);

    std::printf("bench_search: %d messages (mixed English/Chinese, 200 conversations), SQLite %s\n", messages,
                qPrintable(QStringLiteral("(system, via Qt's QSQLITE driver)")));
    QElapsedTimer t;
    t.start();
    QStringList samples;
    if (reuse) {
        std::printf("  store reused (%s): no generation, no build\n", qPrintable(path));
        if (!reusedSamples(path, &samples))
            return 1;
    } else {
        if (!generate(path, messages, 200, rng, &samples))
            return 1;
        std::printf("  store written (SQL, one transaction): %.1f s\n", double(t.elapsed()) / 1000.0);
    }
    const qint64 sizeWithout = reuse ? 0 : usedBytes(path);

    // 1. The index build, as Client runs it (8 ms batches), timed whole.
    Storage store;
    if (!store.open(path))
        return fail(store.lastError()) ? 0 : 1;
    t.restart();
    const qint64 buildCpu0 = cpuNs();
    qint64 batches = 0, longest = 0;
    int lastTenth = 0;
    double rowsS = -1, rowsCpuS = 0;
    for (; !reuse;) {
        QElapsedTimer b;
        b.start();
        const std::optional<Storage::IndexBuild> step = store.buildSearchIndex(8);
        longest = std::max(longest, b.elapsed());
        ++batches;
        if (!step)
            return fail(store.lastError()) ? 0 : 1;
        const int tenth = step->total > 0 ? int(step->done * 10 / step->total) : 10;
        if (tenth > lastTenth && !step->finished) {
            lastTenth = tenth;
            std::printf("    build progress %3d%% at %.1f s\n", tenth * 10, double(t.elapsed()) / 1000.0);
        }
        if (step->finished && rowsS < 0) {
            rowsS = double(t.elapsed()) / 1000.0;
            rowsCpuS = double(cpuNs() - buildCpu0) / 1e9;
            std::printf("    every row indexed (searches find everything) at %.1f s; merging the segments\n", rowsS);
        }
        if (step->settled)
            break;
    }
    const double buildS = double(t.elapsed()) / 1000.0;
    const double buildCpuS = double(cpuNs() - buildCpu0) / 1e9;
    if (!reuse)
        std::printf("  index build: %.1f s wall, %.1f s CPU (%.0f messages/s of CPU) for the rows, then the segment"
                    " merge: %.1f s wall, %.1f s CPU; %lld batches, longest batch %lld ms wall\n",
                    rowsS, rowsCpuS, double(messages) / std::max(rowsCpuS, 0.001), buildS - rowsS,
                    buildCpuS - rowsCpuS, static_cast<long long>(batches), static_cast<long long>(longest));
    const qint64 sizeWith = reuse ? 0 : usedBytes(path);
    if (!reuse)
        std::printf("  store size: %.1f MB without the index, %.1f MB with it: ratio %.2fx (target <= 2x)\n",
                    double(sizeWithout) / 1e6, double(sizeWith) / 1e6,
                    double(sizeWith) / double(std::max<qint64>(1, sizeWithout)));

    // 3. First pages on the reader connection (the search thread's work).
    QStringList mixed, cjk2;
    makeQueries(rng, samples, queries, &mixed, &cjk2);
    im::detail::SearchReader reader(path);
    auto measure = [&](const QStringList &qs, const char *label) {
        std::vector<qint64> ns, cpu;
        qint64 found = 0, full = 0;
        for (const QString &q : qs) {
            QElapsedTimer one;
            one.start();
            const qint64 cpu0 = cpuNs();
            QString error;
            const auto r = im::detail::runSearch(reader, q, {}, 50, 0, &error);
            cpu.push_back(cpuNs() - cpu0);
            ns.push_back(one.nsecsElapsed());
            if (!r) {
                fail(error);
                return false;
            }
            found += r->isEmpty() ? 0 : 1;
            full += r->size() == 50 ? 1 : 0;
        }
        const Pct p = pct(ns), c = pct(cpu);
        // The slowest (CPU) queries: where a p99 comes from.
        std::vector<size_t> order(cpu.size());
        for (size_t i = 0; i < order.size(); ++i)
            order[i] = i;
        std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return cpu[a] > cpu[b]; });
        QStringList slow;
        for (size_t i = 0; i < std::min<size_t>(5, order.size()); ++i)
            slow << QStringLiteral("\"%1\" %2 ms").arg(qs.at(qsizetype(order[i]))).arg(ms(cpu[order[i]]), 0, 'f', 1);
        std::printf("  slowest (CPU): %s\n", qPrintable(slow.join(QStringLiteral(", "))));
        std::printf("  first page (50) %s: wall p50 %.2f ms, p99 %.2f ms, max %.2f ms; CPU p50 %.2f ms, p99 %.2f ms,"
                    " max %.2f ms; over %zu queries (%lld found something, %lld a full page) (target p50 <= 20,"
                    " p99 <= 50)\n",
                    label, p.p50, p.p99, p.max, c.p50, c.p99, c.max, ns.size(), static_cast<long long>(found),
                    static_cast<long long>(full));
        return true;
    };
    if (!applyOnly
        && (!measure(mixed, "words, prefixes, two words, CJK runs") || !measure(cjk2, "two-character Chinese")))
        return 1;

    // 4. A page of 200 new events with and without the index upkeep,
    // alternating (the machine's load changes by the second).
    std::vector<qint64> with, without, withCpu, withoutCpu;
    // Above whatever is stored (a reused store holds the pages of the runs before).
    qint64 seq = 10000000, ts = kT0 + qint64(messages) * 1000 + 1000;
    if (!storedMax(path, &seq, &ts))
        return 1;
    const QString side = cli.value(QStringLiteral("side"));
    for (int i = 0; i < pages * 2; ++i) {
        const bool on = i % 2 == 0;
        if ((side == u"with" && !on) || (side == u"without" && on))
            continue; // one side only (a profiler's or callgrind's run)
        const proto::Page p = newPage(QStringLiteral("conv-%1").arg(i % 200), seq, 200, ts, rng);
        seq += 200;
        ts += 1000;
        store.setSearchUpkeep(on);
        QElapsedTimer one;
        one.start();
        const qint64 cpu0 = cpuNs();
        if (!store.applyPage(p))
            return fail(store.lastError()) ? 0 : 1;
        (on ? withCpu : withoutCpu).push_back(cpuNs() - cpu0);
        (on ? with : without).push_back(one.nsecsElapsed());
    }
    store.setSearchUpkeep(true);
    const Pct pw = pct(with), po = pct(without), cw = pct(withCpu), co = pct(withoutCpu);
    std::printf("  page of 200 events applied (medians of %d): wall %.2f ms with the index, %.2f ms without: ratio"
                " %.2fx; CPU %.2f ms with, %.2f ms without: ratio %.2fx (target <= 1.3x); CPU means %.2f and %.2f ms:"
                " ratio %.2fx (the merges FTS5 does now and then count there)\n",
                pages, pw.p50, po.p50, pw.p50 / std::max(po.p50, 0.001), cw.p50, co.p50, cw.p50 / std::max(co.p50, 0.001),
                cw.mean, co.mean, cw.mean / std::max(co.mean, 0.001));
    return 0;
}
