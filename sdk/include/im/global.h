// Export macro of the ImSdk library.
#pragma once

#include <QtCore/qglobal.h>

#if defined(IM_SDK_SHARED)
#  if defined(IM_SDK_BUILD)
#    define IM_SDK_EXPORT Q_DECL_EXPORT
#  else
#    define IM_SDK_EXPORT Q_DECL_IMPORT
#  endif
#else
#  define IM_SDK_EXPORT
#endif
