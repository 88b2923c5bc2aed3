#include <im/searchmodel.h>

#include "client_p.h"
#include "clientlink_p.h"
#include "modelroles_p.h"
#include "searchtext_p.h"

#include <QtCore/QDateTime>
#include <QtCore/QPointer>
#include <QtCore/QTimer>

namespace im {

class SearchModelPrivate {
public:
    QPointer<Client> client;
    QList<QMetaObject::Connection> links;
    QString query, conv;
    QList<SearchResult> rows;
    QStringList incomplete, purged;
    int pageSize = 50;
    int pending = 0; // the request whose answer we wait for (0: none)
    bool firstPage = false;
    bool more = false;
    bool indexing = false;
    QTimer again; // a search again, coalesced (history arrived, a reset)
};

namespace {
QVariantList rangesToList(const QList<TextRange> &ranges) {
    QVariantList out;
    for (const TextRange &r : ranges)
        out.append(QVariantMap{{QStringLiteral("start"), r.start}, {QStringLiteral("length"), r.length}});
    return out;
}
} // namespace

SearchModel::SearchModel(Client *client, QObject *parent)
    : QAbstractListModel(parent), d(std::make_unique<SearchModelPrivate>()) {
    d->again.setSingleShot(true);
    d->again.setInterval(100);
    connect(&d->again, &QTimer::timeout, this, &SearchModel::refresh);
    setClient(client);
}

SearchModel::~SearchModel() = default;

Client *SearchModel::client() const { return d->client.data(); }

void SearchModel::setClient(Client *client) {
    if (!detail::relink(d->client, d->links, client))
        return;
    if (client) {
        ClientPrivate *cp = ClientPrivate::get(client);
        d->links << connect(cp, &ClientPrivate::aboutToBeDestroyed, this, [this] { setClient(nullptr); });
        d->links << connect(client, &Client::searchFinished, this,
                            [this](int id, const QList<SearchResult> &results, bool more, const QStringList &incomplete,
                                   const QStringList &purged) {
                                if (id != d->pending)
                                    return; // an answer to an older query
                                d->pending = 0;
                                if (!results.isEmpty()) {
                                    beginInsertRows({}, int(d->rows.size()), int(d->rows.size() + results.size() - 1));
                                    d->rows.append(results);
                                    endInsertRows();
                                    emit countChanged();
                                }
                                d->more = more;
                                if (d->firstPage && (incomplete != d->incomplete || purged != d->purged)) {
                                    d->incomplete = incomplete;
                                    d->purged = purged;
                                    emit incompleteConversationsChanged();
                                }
                                emit searchingChanged();
                            });
        // What changes the answer: history loaded or dropped, the index
        // built further. Searched again (from the first page).
        auto soon = [this](const QString &conv) {
            if (!d->query.isEmpty() && (d->conv.isEmpty() || conv.isEmpty() || conv == d->conv))
                d->again.start();
        };
        d->links << connect(&cp->sync, &Sync::windowLoaded, this, [soon](const QString &conv, bool ok) {
            if (ok)
                soon(conv);
        });
        d->links << connect(&cp->sync, &Sync::conversationSynced, this, soon);
        d->links << connect(client, &Client::conversationReset, this, soon);
        d->links << connect(cp, &ClientPrivate::searchIndexChanged, this, [this, soon] {
            const bool indexing = d->client && d->client->searchIndexProgress() < 1.0;
            if (indexing != d->indexing) {
                d->indexing = indexing;
                emit indexingChanged();
            }
            soon(QString());
        });
        d->indexing = client->searchIndexProgress() < 1.0;
    }
    emit clientChanged();
    emit indexingChanged();
    refresh();
}

QString SearchModel::query() const { return d->query; }

void SearchModel::setQuery(const QString &query) {
    if (query == d->query)
        return;
    d->query = query;
    emit queryChanged();
    refresh();
}

QString SearchModel::conversation() const { return d->conv; }

void SearchModel::setConversation(const QString &conv) {
    if (conv == d->conv)
        return;
    d->conv = conv;
    emit conversationChanged();
    refresh();
}

bool SearchModel::isSearching() const { return d->pending != 0; }
QStringList SearchModel::incompleteConversations() const { return d->incomplete; }
QStringList SearchModel::purgedConversations() const { return d->purged; }
bool SearchModel::isIndexing() const { return d->indexing; }
int SearchModel::count() const { return int(d->rows.size()); }
int SearchModel::pageSize() const { return d->pageSize; }

void SearchModel::setPageSize(int rows) {
    rows = std::clamp(rows, 1, 1000);
    if (rows == d->pageSize)
        return;
    d->pageSize = rows;
    emit pageSizeChanged();
}

void SearchModel::refresh() {
    d->again.stop();
    const bool wasSearching = d->pending != 0;
    const bool hadRows = !d->rows.isEmpty();
    beginResetModel();
    d->rows.clear();
    d->more = false;
    d->pending = 0;
    endResetModel();
    if (hadRows)
        emit countChanged();
    const bool searchable = d->client && d->client->isOpen() && !detail::searchtext::ftsQuery(d->query).isEmpty();
    if (searchable) {
        d->firstPage = true;
        d->pending = d->client->search(d->query, d->conv, d->pageSize, 0);
    } else if (!d->incomplete.isEmpty() || !d->purged.isEmpty()) {
        d->incomplete.clear();
        d->purged.clear();
        emit incompleteConversationsChanged();
    }
    if (wasSearching != (d->pending != 0))
        emit searchingChanged();
}

int SearchModel::rowCount(const QModelIndex &parent) const { return parent.isValid() ? 0 : int(d->rows.size()); }

QVariant SearchModel::data(const QModelIndex &index, int role) const {
    if (!index.isValid() || index.row() < 0 || index.row() >= d->rows.size())
        return {};
    const SearchResult &r = d->rows.at(index.row());
    switch (role) {
    case ConvRole: return r.conv();
    case SeqRole: return r.seq();
    case SenderRole: return r.sender();
    case TimestampRole: return QDateTime::fromMSecsSinceEpoch(r.ts(), Qt::UTC);
    case Qt::DisplayRole:
    case BodyRole: return r.body();
    case MatchesRole: return rangesToList(r.matches());
    case SnippetRole: return r.snippet();
    case SnippetMatchesRole: return rangesToList(r.snippetMatches());
    default: return {};
    }
}

QHash<int, QByteArray> SearchModel::roleNames() const {
    return {{ConvRole, "conv"},       {SeqRole, "seq"},         {SenderRole, "sender"},
            {TimestampRole, "ts"},    {BodyRole, "body"},       {MatchesRole, "matches"},
            {SnippetRole, "snippet"}, {SnippetMatchesRole, "snippetMatches"}};
}

bool SearchModel::canFetchMore(const QModelIndex &parent) const {
    return !parent.isValid() && d->more && d->pending == 0 && d->client;
}

void SearchModel::fetchMore(const QModelIndex &parent) {
    if (!canFetchMore(parent) || d->rows.isEmpty())
        return;
    d->firstPage = false;
    d->pending = d->client->search(d->query, d->conv, d->pageSize, d->rows.last().position());
    if (d->pending != 0)
        emit searchingChanged();
}

SearchResult SearchModel::result(int row) const {
    return row >= 0 && row < d->rows.size() ? d->rows.at(row) : SearchResult();
}

QVariantMap SearchModel::get(int row) const { return detail::rowByRoleName(this, row); }

void SearchModel::loadMissing(const QString &conv) {
    if (!d->client)
        return;
    if (!conv.isEmpty()) {
        d->client->loadMissingHistory(conv);
        return;
    }
    for (const QString &c : std::as_const(d->incomplete))
        d->client->loadMissingHistory(c);
}

} // namespace im
