#include "conversationpanel.h"

#include "panelutil.h"
#include "presencelist.h"
#include "roletablemodel.h"

#include <im/conversationlistmodel.h>

#include <QtGui/QColor>
#include <QtGui/QFont>
#include <QtWidgets/QHeaderView>
#include <QtWidgets/QTableView>
#include <QtWidgets/QVBoxLayout>

using im::ConversationListModel;

ConversationPanel::ConversationPanel(ConversationListModel *convs, QWidget *parent)
    : QGroupBox(tr("Conversations"), parent), convs_(convs) {
    setObjectName(QStringLiteral("conversationPanel"));
    table_ = new RoleTableModel(
        convs_,
        {{tr("Conversation"),
          [](const QModelIndex &s, int role) -> QVariant {
              if (role == Qt::DisplayRole) {
                  QString t = s.data(ConversationListModel::ConvRole).toString();
                  if (s.data(ConversationListModel::HasGapRole).toBool())
                      t += QStringLiteral(" (gap)");
                  return t;
              }
              if (role == Qt::ToolTipRole)
                  return QStringLiteral("%1, epoch %2, cursor %3, delivered %4")
                      .arg(s.data(ConversationListModel::KindRole).toString())
                      .arg(s.data(ConversationListModel::EpochRole).toLongLong())
                      .arg(s.data(ConversationListModel::CursorRole).toLongLong())
                      .arg(s.data(ConversationListModel::DeliveredRole).toLongLong());
              if (role == Qt::FontRole && s.data(ConversationListModel::UnreadRole).toLongLong() > 0) {
                  QFont f;
                  f.setBold(true);
                  return f;
              }
              return {};
          }},
         {tr("Unread"),
          [](const QModelIndex &s, int role) -> QVariant {
              const qint64 n = s.data(ConversationListModel::UnreadRole).toLongLong();
              if (role == Qt::DisplayRole)
                  return n;
              if (role == Qt::TextAlignmentRole)
                  return int(Qt::AlignCenter);
              if (role == Qt::BackgroundRole && n > 0)
                  return QColor(0x2b, 0x6c, 0xd4);
              if (role == Qt::ForegroundRole && n > 0)
                  return QColor(Qt::white);
              if (role == Qt::FontRole && n > 0) {
                  QFont f;
                  f.setBold(true);
                  return f;
              }
              return {};
          }},
         {tr("Head"),
          [](const QModelIndex &s, int role) -> QVariant {
              if (role == Qt::DisplayRole)
                  return s.data(ConversationListModel::HeadRole);
              if (role == Qt::TextAlignmentRole)
                  return int(Qt::AlignCenter);
              return {};
          }},
         {tr("Read"),
          [](const QModelIndex &s, int role) -> QVariant {
              if (role == Qt::DisplayRole)
                  return s.data(ConversationListModel::ReadRole);
              if (role == Qt::TextAlignmentRole)
                  return int(Qt::AlignCenter);
              return {};
          }}},
        this);
    view_ = makeTable(QStringLiteral("convView"));
    view_->setModel(table_);
    view_->horizontalHeader()->setSectionResizeMode(0, QHeaderView::Stretch);
    for (int c = 1; c < 4; ++c)
        view_->horizontalHeader()->setSectionResizeMode(c, QHeaderView::ResizeToContents);
    connect(view_->selectionModel(), &QItemSelectionModel::currentRowChanged, this, [this](const QModelIndex &cur) {
        if (!cur.isValid())
            return;
        const QString conv = table_->sourceIndex(cur.row()).data(ConversationListModel::ConvRole).toString();
        if (!conv.isEmpty() && conv != current_)
            emit conversationActivated(conv);
    });
    connect(table_, &QAbstractItemModel::rowsInserted, this, &ConversationPanel::listChanged);
    connect(table_, &QAbstractItemModel::rowsRemoved, this, &ConversationPanel::listChanged);
    connect(table_, &QAbstractItemModel::modelReset, this, &ConversationPanel::listChanged);
    connect(table_, &QAbstractItemModel::dataChanged, this, &ConversationPanel::markersChanged);

    auto *l = new QVBoxLayout(this);
    l->addWidget(view_);
    l->addWidget(new PresenceList(convs_)); // online dots, last seen (contract 13)
    setMinimumWidth(230);
}

void ConversationPanel::showCurrent(const QString &conv) {
    current_ = conv;
    const int row = convs_->indexOf(conv);
    if (row >= 0 && view_->currentIndex().row() != row)
        view_->setCurrentIndex(table_->index(row, 0));
    else if (row < 0 && !conv.isEmpty())
        view_->setCurrentIndex(QModelIndex()); // not listed (yet): no stale highlight
}
