// im::ConversationListModel: the conversations known to the local database.
#pragma once

#include <im/client.h>
#include <im/global.h>

#include <QtCore/QAbstractListModel>

#include <memory>

namespace im {

class ConversationListModelPrivate;

/**
 * Conversations with their markers (from `convs`, pages and hints), most
 * recent activity first. Updated live.
 */
class IM_SDK_EXPORT ConversationListModel : public QAbstractListModel {
    Q_OBJECT
    /// The Client whose database is shown; may be set (or changed) after
    /// construction, as QML does. Without one the model is empty.
    Q_PROPERTY(im::Client *client READ client WRITE setClient NOTIFY clientChanged)
    Q_PROPERTY(int count READ count NOTIFY countChanged)
public:
    enum Roles {
        ConvRole = Qt::UserRole + 1, ///< QString conversation id (also Qt::DisplayRole)
        KindRole,          ///< QString "direct" or "group"
        HeadRole,          ///< qint64 highest seq the server says we may know
        UnreadRole,        ///< qint64 unread messages from others
        ReadRole,          ///< qint64 the user's read marker
        DeliveredRole,     ///< qint64 this device's delivered marker
        EpochRole,         ///< qint64 the epoch of the local cursor (0 = none yet)
        HasGapRole,        ///< bool: retention purged events we never saw (trimmed)
        CursorRole,        ///< qint64 last applied seq (the sync cursor)
        LastTimestampRole, ///< QDateTime of the newest local event
        /// QStringList: the other users typing in it now, sorted (contract
        /// section 13; Client::typingUsers()). Changes emit dataChanged
        /// with this role only.
        TypingRole,
    };
    Q_ENUM(Roles)

    explicit ConversationListModel(Client *client = nullptr, QObject *parent = nullptr);
    ~ConversationListModel() override;

    Client *client() const;
    void setClient(Client *client);

    int count() const;
    int rowCount(const QModelIndex &parent = QModelIndex()) const override;
    QVariant data(const QModelIndex &index, int role = Qt::DisplayRole) const override;
    QHash<int, QByteArray> roleNames() const override;
    /// Value of `role` (a Roles value) at `row`.
    Q_INVOKABLE QVariant get(int row, int role) const;
    /// Value of the role called `roleName` (a roleNames() name) at `row`.
    Q_INVOKABLE QVariant get(int row, const QString &roleName) const;
    /// Every role of `row` by role name (QML: `model.get(0).conv`); empty if no such row.
    Q_INVOKABLE QVariantMap get(int row) const;
    /// Row of a conversation id, or -1.
    Q_INVOKABLE int indexOf(const QString &conv) const;

public Q_SLOTS:
    void refresh();

Q_SIGNALS:
    void clientChanged();
    void countChanged();

private:
    std::unique_ptr<ConversationListModelPrivate> d;
};

} // namespace im
