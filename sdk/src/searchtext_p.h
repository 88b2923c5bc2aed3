// On-device search, the text side (pure: no SQL, no I/O): what the FTS5
// index stores for a message's text, the FTS5 query for what the user
// typed, and the matched ranges of a result for highlighting (obligation 18,
// docs/sdk.md "Search").
//
// The index is one FTS5 table with SQLite's own `unicode61
// remove_diacritics 2` tokenizer (case- and accent-insensitive words; every
// SQLite build with FTS5 has it, no custom tokenizer to register through a
// driver handle). Latin (and every other space-separated) script goes to it
// as it is: words, matched by prefix. Chinese, Japanese and Korean runs
// (no spaces between words) are rewritten before they reach it: a run
// c1 c2 ... cn becomes its overlapping bigrams "c1c2 c2c3 ... c(n-1)cn" and
// the unigram "cn" (so that a single character matches as the prefix of a
// bigram or as that last unigram). A query run of two or more characters is
// the phrase of its bigrams (consecutive, so "any substring of two or more
// characters" matches exactly); one character is a prefix query.
#pragma once

#include <QtCore/QList>
#include <QtCore/QString>
#include <QtCore/QStringList>

#include <functional>
#include <optional>

namespace im::detail::searchtext {

/// Bumped whenever indexText() changes what it produces: a store indexed
/// under another version is rebuilt (the contentless index must be given
/// the very text it indexed to delete a row).
constexpr int Version = 1;

/// Whether the code point belongs to a script written without spaces
/// between words (Han, Hiragana, Katakana, Hangul, Bopomofo).
bool isCjk(char32_t ucs4);

/// The text the index stores for a message body (NFKC, CJK runs as bigrams).
QString indexText(const QString &body);

/// What the user typed, as an FTS5 query over column `body` (every word
/// must match: Latin words by prefix, CJK runs as substrings); empty if the
/// query has nothing to search for (only spaces or punctuation).
QString ftsQuery(const QString &userQuery);

/// The words of a text the vocabulary (table search_terms) keeps, so that a
/// query's last word, a prefix, becomes the few whole words it stands for:
/// FTS5 without a prefix index reads and merges every doclist of a prefix
/// before it returns one row (the very common words' are the longest),
/// whereas an OR of whole words is read lazily, newest first, and stops at
/// the page. Each non-CJK word folded as unicode61 remove_diacritics 2
/// folds it, when that is ASCII; a word whose folded form is not (their
/// folding could differ from ours) leaves its ASCII lead followed by
/// VocabPrefixMark ("straße": "stra" + mark), which the query expands to
/// the FTS5 prefix of that lead. No duplicates.
constexpr QChar VocabPrefixMark = QChar(0x01);
QStringList vocabTerms(const QString &body);

/// ftsQuery() with the last word of each Latin chunk expanded: `expand`
/// gets its folded ASCII prefix and returns the vocabulary's entries that
/// start with it (vocabTerms()'s form), or nothing when they are too many
/// or unknown (then that word stays an FTS5 prefix query).
QString ftsQuery(const QString &userQuery, const std::function<std::optional<QStringList>(const QString &)> &expand);

/// The terms of a query as highlight() looks for them (folded).
struct Term {
    QString folded;
    bool cjk = false; // matched anywhere; else at a word start (prefix)
};
QList<Term> terms(const QString &userQuery);

struct Range {
    int start = 0;  // UTF-16 offset in the text
    int length = 0; // UTF-16 code units
    bool operator==(const Range &) const = default;
};

/// Where the query's terms occur in `text` (UTF-16 offsets into `text`,
/// sorted, overlapping ones merged): case- and accent-insensitive, Latin
/// terms at word starts, CJK terms anywhere.
QList<Range> matchedRanges(const QString &text, const QList<Term> &terms);

/// One line of `text` around its first match (at most `width` characters,
/// "…" where cut), with the ranges moved into it.
struct Snippet {
    QString text;
    QList<Range> ranges;
};
Snippet snippet(const QString &text, const QList<Range> &ranges, int width = 100);

} // namespace im::detail::searchtext
