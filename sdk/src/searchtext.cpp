// On-device search, the text side: see searchtext_p.h.
#include "searchtext_p.h"

#include <QtCore/QChar>
#include <QtCore/QStringView>

#include <algorithm>

namespace im::detail::searchtext {

namespace {

bool isAscii(QStringView s) {
    return std::all_of(s.begin(), s.end(), [](QChar c) { return c.unicode() < 0x80; });
}

QString nfkc(const QString &s) { return isAscii(s) ? s : s.normalized(QString::NormalizationForm_KC); }

// unicode61's token characters (Unicode categories L*, N*, Co).
bool isWordChar(char32_t c) {
    if (c < 0x80)
        return (c >= u'a' && c <= u'z') || (c >= u'A' && c <= u'Z') || (c >= u'0' && c <= u'9');
    return QChar::isLetterOrNumber(c) || QChar::category(c) == QChar::Other_PrivateUse;
}

QString quoted(const QString &s) {
    QString out = s;
    out.replace(u'"', QStringLiteral("\"\""));
    return u'"' + out + u'"';
}

// The code points of s, each with its UTF-16 offset.
struct Cp {
    char32_t c;
    int at;
    int len;
};
QList<Cp> codePoints(QStringView s) {
    QList<Cp> out;
    out.reserve(s.size());
    for (int i = 0; i < s.size();) {
        const QChar h = s.at(i);
        if (h.isHighSurrogate() && i + 1 < s.size() && s.at(i + 1).isLowSurrogate()) {
            out.append({QChar::surrogateToUcs4(h, s.at(i + 1)), i, 2});
            i += 2;
        } else {
            out.append({h.unicode(), i, 1});
            ++i;
        }
    }
    return out;
}

// One code point, folded: compatibility decomposition, combining marks
// dropped, case folded (what unicode61 remove_diacritics 2 does to Latin).
QString foldCp(char32_t c) {
    if (c < 0x80) {
        const char16_t ch = (c >= u'A' && c <= u'Z') ? char16_t(c + 32) : char16_t(c);
        return QString(QChar(ch));
    }
    const QString d = QString::fromUcs4(&c, 1).normalized(QString::NormalizationForm_KD);
    QString out;
    for (const Cp &p : codePoints(d)) {
        if (QChar::category(p.c) == QChar::Mark_NonSpacing)
            continue;
        out += QString::fromUcs4(&p.c, 1);
    }
    return out.toCaseFolded();
}

QString fold(const QString &s) {
    QString out;
    for (const Cp &p : codePoints(s))
        out += foldCp(p.c);
    return out;
}

// Runs of a query or a text: CJK runs and the rest.
struct Run {
    QString text;
    bool cjk = false;
};
QList<Run> runs(const QString &s) {
    QList<Run> out;
    for (const Cp &p : codePoints(s)) {
        const bool cjk = isCjk(p.c);
        if (out.isEmpty() || out.last().cjk != cjk)
            out.append({QString(), cjk});
        out.last().text += QStringView(s).mid(p.at, p.len);
    }
    return out;
}

} // namespace

bool isCjk(char32_t c) {
    if (c < 0x1100)
        return false;
    switch (QChar::script(c)) {
    case QChar::Script_Han:
    case QChar::Script_Hiragana:
    case QChar::Script_Katakana:
    case QChar::Script_Hangul:
    case QChar::Script_Bopomofo:
        return true;
    default:
        // The iteration mark and the prolonged sound mark (Common script)
        // belong to the words around them.
        return c == 0x3005 || c == 0x30FC;
    }
}

QString indexText(const QString &body) {
    const QString n = nfkc(body);
    if (isAscii(n))
        return n;
    // One pass (it runs for every stored message, inside the page's
    // transaction): the text as it is, each CJK run c1..cn as
    // " c1c2 c2c3 ... c(n-1)cn cn ".
    QString out;
    out.reserve(n.size() * 3);
    const QStringView v(n);
    qsizetype prevAt = -1, prevLen = 0; // the run's previous code point (-1: not in a run)
    for (qsizetype i = 0; i < v.size();) {
        const QChar h = v.at(i);
        const bool pair = h.isHighSurrogate() && i + 1 < v.size() && v.at(i + 1).isLowSurrogate();
        const qsizetype len = pair ? 2 : 1;
        const char32_t c = pair ? QChar::surrogateToUcs4(h, v.at(i + 1)) : char32_t(h.unicode());
        if (isCjk(c)) {
            if (prevAt < 0) {
                out += u' ';
            } else {
                out += v.mid(prevAt, prevLen + len);
                out += u' ';
            }
            prevAt = i;
            prevLen = len;
        } else {
            if (prevAt >= 0) {
                out += v.mid(prevAt, prevLen);
                out += u' ';
                prevAt = -1;
            }
            out += v.mid(i, len);
        }
        i += len;
    }
    if (prevAt >= 0) {
        out += v.mid(prevAt, prevLen);
        out += u' ';
    }
    return out;
}

QString ftsQuery(const QString &userQuery) { return ftsQuery(userQuery, {}); }

namespace {

bool asciiOnly(const QString &s) {
    return std::all_of(s.begin(), s.end(), [](QChar c) { return c.unicode() < 0x80; });
}

// The words (runs of token characters) of a non-CJK run, as typed.
QStringList words(const QString &run) {
    QStringList out;
    QString word;
    for (const Cp &p : codePoints(run)) {
        if (isWordChar(p.c)) {
            word += QStringView(run).mid(p.at, p.len);
        } else if (!word.isEmpty()) {
            out << word;
            word.clear();
        }
    }
    if (!word.isEmpty())
        out << word;
    return out;
}

// As unicode61 remove_diacritics 2 folds a token, near enough: marks
// dropped, lower case (not case folding: it keeps "ß", and so does this).
// Where the two could differ the result is not ASCII, and vocabTerms()
// keeps only its ASCII lead, as an FTS5 prefix: never a word missed.
QString foldWord(const QString &w) {
    if (!asciiOnly(w)) {
        QString out;
        for (const Cp &p : codePoints(w)) {
            const QString d = QString::fromUcs4(&p.c, 1).normalized(QString::NormalizationForm_KD);
            for (const Cp &q : codePoints(d))
                if (QChar::category(q.c) != QChar::Mark_NonSpacing)
                    out += QString::fromUcs4(&q.c, 1);
        }
        return out.toLower();
    }
    QString out = w;
    for (QChar &c : out)
        if (c >= u'A' && c <= u'Z')
            c = QChar(c.unicode() + 32);
    return out;
}

} // namespace

QStringList vocabTerms(const QString &body) {
    // One pass over the code points (it runs for every stored message):
    // a word is a run of token characters outside the CJK runs.
    QStringList out;
    const QString n = nfkc(body);
    const QStringView v(n);
    auto add = [&out](QStringView word, bool ascii) {
        QString entry;
        if (ascii) {
            entry = word.toString();
            for (QChar &c : entry)
                if (c >= u'A' && c <= u'Z')
                    c = QChar(c.unicode() + 32);
        } else {
            const QString f = foldWord(word.toString());
            if (asciiOnly(f)) {
                entry = f;
            } else {
                qsizetype lead = 0;
                while (lead < f.size() && f.at(lead).unicode() < 0x80)
                    ++lead;
                if (lead == 0)
                    return;
                entry = f.left(lead) + VocabPrefixMark;
            }
        }
        if (!out.contains(entry))
            out << entry;
    };
    qsizetype start = -1; // the current word's first UTF-16 unit (-1: none)
    bool ascii = true;
    for (qsizetype i = 0; i < v.size();) {
        const QChar h = v.at(i);
        const bool pair = h.isHighSurrogate() && i + 1 < v.size() && v.at(i + 1).isLowSurrogate();
        const qsizetype len = pair ? 2 : 1;
        const char32_t c = pair ? QChar::surrogateToUcs4(h, v.at(i + 1)) : char32_t(h.unicode());
        if (!isCjk(c) && isWordChar(c)) {
            if (start < 0) {
                start = i;
                ascii = true;
            }
            ascii = ascii && c < 0x80;
        } else if (start >= 0) {
            add(v.mid(start, i - start), ascii);
            start = -1;
        }
        i += len;
    }
    if (start >= 0)
        add(v.mid(start), ascii);
    return out;
}

QString ftsQuery(const QString &userQuery, const std::function<std::optional<QStringList>(const QString &)> &expand) {
    QStringList parts;
    const QString n = nfkc(userQuery);
    for (const QString &chunk : n.split(QChar::Space, Qt::SkipEmptyParts)) {
        for (const Run &r : runs(chunk.simplified())) {
            if (r.cjk) {
                const QList<Cp> cps = codePoints(r.text);
                if (cps.size() == 1) {
                    parts << quoted(r.text) + u'*';
                    continue;
                }
                QStringList grams;
                for (qsizetype i = 0; i + 1 < cps.size(); ++i)
                    grams << QStringView(r.text).mid(cps[i].at, cps[i].len + cps[i + 1].len).toString();
                parts << quoted(grams.join(u' '));
                continue;
            }
            const QStringList ws = words(r.text);
            if (ws.isEmpty())
                continue;
            // A phrase of the chunk's words, the last by prefix: as the
            // whole words it stands for when the vocabulary says which.
            const QString lead = ws.size() > 1 ? ws.mid(0, ws.size() - 1).join(u' ') + u' ' : QString();
            const QString last = foldWord(ws.last());
            std::optional<QStringList> whole;
            if (expand && asciiOnly(last))
                whole = expand(last);
            if (!whole) {
                parts << quoted(lead + ws.last()) + u'*';
                continue;
            }
            QStringList alternatives;
            for (const QString &t : std::as_const(*whole))
                alternatives << (t.endsWith(VocabPrefixMark) ? quoted(lead + t.chopped(1)) + u'*' : quoted(lead + t));
            // None: nothing stored starts with it (a query that finds nothing).
            parts << (alternatives.isEmpty() ? quoted(lead + ws.last()) + u'*'
                                             : u'(' + alternatives.join(QStringLiteral(" OR ")) + u')');
        }
    }
    return parts.join(QStringLiteral(" AND "));
}

QList<Term> terms(const QString &userQuery) {
    QList<Term> out;
    const QString n = nfkc(userQuery);
    for (const Run &r : runs(n)) {
        if (r.cjk) {
            out.append({fold(r.text), true});
            continue;
        }
        QString word;
        for (const Cp &p : codePoints(r.text)) {
            if (isWordChar(p.c)) {
                word += QStringView(r.text).mid(p.at, p.len);
            } else if (!word.isEmpty()) {
                out.append({fold(word), false});
                word.clear();
            }
        }
        if (!word.isEmpty())
            out.append({fold(word), false});
    }
    return out;
}

QList<Range> matchedRanges(const QString &text, const QList<Term> &terms) {
    // The folded text, each folded UTF-16 unit with the original code
    // point it came from.
    const QList<Cp> cps = codePoints(text);
    QString folded;
    QList<int> origin; // folded index -> index into cps
    QList<bool> wordStart;
    folded.reserve(text.size());
    bool prevWord = false;
    for (int i = 0; i < cps.size(); ++i) {
        const QString f = foldCp(cps[i].c);
        const bool word = isWordChar(cps[i].c) && !isCjk(cps[i].c);
        for (int k = 0; k < f.size(); ++k) {
            folded += f.at(k);
            origin.append(i);
            wordStart.append(k == 0 && word && !prevWord);
        }
        if (!f.isEmpty())
            prevWord = word;
    }
    QList<Range> found;
    for (const Term &t : terms) {
        if (t.folded.isEmpty())
            continue;
        for (qsizetype at = folded.indexOf(t.folded); at >= 0; at = folded.indexOf(t.folded, at + 1)) {
            if (!t.cjk && !wordStart.at(at))
                continue;
            const Cp &first = cps.at(origin.at(at));
            const Cp &last = cps.at(origin.at(at + t.folded.size() - 1));
            found.append({first.at, last.at + last.len - first.at});
        }
    }
    std::sort(found.begin(), found.end(), [](const Range &a, const Range &b) { return a.start < b.start; });
    QList<Range> merged;
    for (const Range &r : found) {
        if (!merged.isEmpty() && r.start <= merged.last().start + merged.last().length) {
            Range &m = merged.last();
            m.length = std::max(m.start + m.length, r.start + r.length) - m.start;
        } else {
            merged.append(r);
        }
    }
    return merged;
}

Snippet snippet(const QString &text, const QList<Range> &ranges, int width) {
    QString line = text;
    for (QChar &c : line)
        if (c == u'\n' || c == u'\r' || c == u'\t')
            c = u' ';
    if (line.size() <= width)
        return {line, ranges};
    const int first = ranges.isEmpty() ? 0 : ranges.first().start;
    int from = std::max(0, first - width / 3);
    if (from + width > line.size())
        from = std::max(0, int(line.size()) - width);
    if (from > 0 && line.at(from).isLowSurrogate())
        ++from;
    int to = std::min(int(line.size()), from + width);
    if (to < line.size() && line.at(to).isLowSurrogate())
        --to;
    Snippet s;
    const QString lead = from > 0 ? QStringLiteral("\u2026") : QString();
    s.text = lead + line.mid(from, to - from) + (to < line.size() ? QStringLiteral("\u2026") : QString());
    for (const Range &r : ranges) {
        const int a = std::max(r.start, from), b = std::min(r.start + r.length, to);
        if (b > a)
            s.ranges.append({a - from + int(lead.size()), b - a});
    }
    return s;
}

} // namespace im::detail::searchtext
