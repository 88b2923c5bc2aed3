// im::SearchModel and im::SearchResult: on-device search of the stored
// messages (obligation 18, docs/sdk.md "Search").
#pragma once

#include <im/client.h>
#include <im/global.h>
#include <im/search.h>

#include <QtCore/QAbstractListModel>
#include <QtCore/QList>
#include <QtCore/QString>
#include <QtCore/QStringList>

#include <memory>

namespace im {

class SearchModelPrivate;

/**
 * Full-text search of the messages stored on this device, newest first.
 *
 * \code
 *   im::SearchModel results(&client);
 *   results.setQuery("meeting 周五");     // every word must match
 *   // rows come asynchronously (searching goes true, then false);
 *   // fetchMore() pages further; incompleteConversations says where the
 *   // stored history has holes, loadMissing(conv) fills them.
 * \endcode
 *
 * What matches: the current text of every stored message (edits applied;
 * recalled ones never), case- and accent-insensitively: Latin (and other
 * space-separated) words by prefix ("mee" finds "Meeting", "cafe" finds
 * "Café"), Chinese, Japanese and Korean by any substring of one or more
 * characters ("周五" finds "下周五开会"). Every word of the query must occur.
 *
 * Queries run on the client's search thread with a read-only connection
 * of their own: the model's thread never waits for one. A store written by
 * an older SDK gets its index built in the background after open()
 * (Client::searchIndexProgress); until then results may be missing and
 * `indexing` is true.
 *
 * QML: `SearchModel { client: myClient; query: field.text }` (import ImSdk).
 */
class IM_SDK_EXPORT SearchModel : public QAbstractListModel {
    Q_OBJECT
    /// The Client whose store is searched (may be set after construction).
    Q_PROPERTY(im::Client *client READ client WRITE setClient NOTIFY clientChanged)
    /// What the user typed. Empty (or only punctuation): no rows.
    Q_PROPERTY(QString query READ query WRITE setQuery NOTIFY queryChanged)
    /// The conversation to search; empty: all of them.
    Q_PROPERTY(QString conversation READ conversation WRITE setConversation NOTIFY conversationChanged)
    /// A query (first page or fetchMore()) is running.
    Q_PROPERTY(bool searching READ isSearching NOTIFY searchingChanged)
    /// The searched conversations whose history is not all stored here
    /// (history windows not loaded, gaps, not synced to the head):
    /// messages there may be missing from the results. loadMissing() loads
    /// more of them; the model searches again when they arrive.
    Q_PROPERTY(QStringList incompleteConversations READ incompleteConversations NOTIFY incompleteConversationsChanged)
    /// The searched conversations whose oldest events were purged on the
    /// server before this device stored them: never searchable here.
    Q_PROPERTY(QStringList purgedConversations READ purgedConversations NOTIFY incompleteConversationsChanged)
    /// The index of a store written by an older SDK is still being built.
    Q_PROPERTY(bool indexing READ isIndexing NOTIFY indexingChanged)
    Q_PROPERTY(int count READ count NOTIFY countChanged)
    /// Rows per page (first page and each fetchMore()); default 50.
    Q_PROPERTY(int pageSize READ pageSize WRITE setPageSize NOTIFY pageSizeChanged)
public:
    enum Roles {
        ConvRole = Qt::UserRole + 1, ///< QString conversation id
        SeqRole,            ///< qint64 the message's seq
        SenderRole,         ///< QString sender's user id
        TimestampRole,      ///< QDateTime commit time (UTC)
        BodyRole,           ///< QString current text (also Qt::DisplayRole)
        MatchesRole,        ///< list of {start, length} (UTF-16) in body
        SnippetRole,        ///< QString one line around the first match
        SnippetMatchesRole, ///< list of {start, length} in snippet
    };
    Q_ENUM(Roles)

    explicit SearchModel(Client *client = nullptr, QObject *parent = nullptr);
    ~SearchModel() override;

    Client *client() const;
    void setClient(Client *client);
    QString query() const;
    void setQuery(const QString &query);
    QString conversation() const;
    void setConversation(const QString &conv);
    bool isSearching() const;
    QStringList incompleteConversations() const;
    QStringList purgedConversations() const;
    bool isIndexing() const;
    int count() const;
    int pageSize() const;
    void setPageSize(int rows);

    int rowCount(const QModelIndex &parent = QModelIndex()) const override;
    QVariant data(const QModelIndex &index, int role = Qt::DisplayRole) const override;
    QHash<int, QByteArray> roleNames() const override;
    /// More results exist and no query is running.
    bool canFetchMore(const QModelIndex &parent = QModelIndex()) const override;
    /// Loads the next pageSize results (asynchronously).
    void fetchMore(const QModelIndex &parent = QModelIndex()) override;
    /// The result at `row` (an empty one if there is none).
    SearchResult result(int row) const;
    /// Every role of `row` by role name (QML: `model.get(0).seq`).
    Q_INVOKABLE QVariantMap get(int row) const;

public Q_SLOTS:
    /// Loads more of the missing history of `conv` (one of
    /// incompleteConversations; empty: all of them): Client::loadMissingHistory().
    void loadMissing(const QString &conv = QString());
    /// Runs the query again from the first page.
    void refresh();

Q_SIGNALS:
    void clientChanged();
    void queryChanged();
    void conversationChanged();
    void searchingChanged();
    void incompleteConversationsChanged();
    void indexingChanged();
    void countChanged();
    void pageSizeChanged();

private:
    std::unique_ptr<SearchModelPrivate> d;
};

} // namespace im
