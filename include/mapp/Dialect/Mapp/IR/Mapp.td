// Umbrella: everything the mapp dialect defines.
#ifndef MAPP_TD
#define MAPP_TD

include "mapp/Dialect/Mapp/IR/MappDialect.td"
include "mapp/Dialect/Mapp/IR/MappAttrs.td"
include "mapp/Dialect/Mapp/IR/MappOpInterfaces.td"
include "mapp/Dialect/Mapp/IR/MappOps.td"

#endif // MAPP_TD
